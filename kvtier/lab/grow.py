"""The lab's growth stage: a serving Spark is removed (playbooks/remove_spark.yml) and added back
(playbooks/add_spark.yml) while a client streams requests through the router; no request may fail.

Between the two, the cluster is checked as an operator would see it: with the inventory still listing the Spark,
health names it gone; with the inventory edited, health is clean on the one Spark left, and the router, the
coordinator, the L2 logins and every firewall have let it go. After the add, it is back at the router, in the P2P
group and the coordinator (add_spark.yml's gates: a P2P canary each way, a set a peer stored hitting there).
"""

from __future__ import annotations

from kvtier.lab import day2
from kvtier.lab.checks import errors_in, health_run, playbook, router_kept
from kvtier.lab.faults import STOPPED_CODES, named_errors
from kvtier.lab.inventory import FAULTY_SPARK, SPARKS, STORAGE, STORAGE_DATA_ADDRESS, proof_target, spark_unlisted
from kvtier.lab.stages import StageFailed, until
from kvtier.vm import host

# The Spark taken out and put back: the one the fault stages after this one work on.
LEAVING = FAULTY_SPARK
# The router reloads its configuration at the end of remove_spark.yml's router play: the server is gone right after.
ROUTER_S = 30.0


def removed_and_added(out) -> str:
    t = proof_target()
    others = sorted(set(t.nodes) - {LEAVING})
    with router_kept(out), day2.under_client_stream(out, STORAGE_DATA_ADDRESS, t.model) as (stream, watch):
        removed = playbook(out, "remove_spark.yml", extravars={"kvtier_spark": LEAVING})
        only = f"the router lists only {', '.join(others)}"
        until(only, ROUTER_S, lambda: sorted(watch.current) == others, every=1.0)
        named = _gone_named(out, t)
        with spark_unlisted(LEAVING):
            left = _left_clean(out)
        traces = _traces(t)
        if traces:
            raise StageFailed(f"{LEAVING} is still part of the cluster after remove_spark.yml: {'; '.join(traces)}")
        added = playbook(out, "add_spark.yml", extravars={"kvtier_spark": LEAVING})
        until(f"{LEAVING} UP at the router", ROUTER_S, lambda: watch.current.get(LEAVING) == "UP", every=1.0)
    streamed = day2.report(out, stream, watch, leaving={LEAVING})
    after, _ = health_run(out)
    errors = errors_in(after)
    if errors:
        raise StageFailed(f"health after {LEAVING} was added back: {', '.join(errors)}")
    return (
        f"removed: {removed}; with the inventory still listing it, health names {named}; unlisted: {left}; "
        f"its router backend, coordinator entry, L2 login, units and firewall admissions gone; added back: {added}, "
        f"UP at the router; {streamed}; health clean"
    )


def _gone_named(out, t) -> str:
    """Health with the inventory still listing the removed Spark names it gone on it, its peers and the coordinator."""
    on_it, on_peers, at_coordinator = STOPPED_CODES
    wanted = {s: on_it if s == LEAVING else on_peers for s in t.nodes}
    where = t.spec.p2p.coordinator.node
    wanted[where] = wanted.get(where, set()) | at_coordinator
    every = set().union(*STOPPED_CODES)
    found, _ = health_run(out)
    named = named_errors(found, every)
    missing = {h: sorted(c - named.get(h, set())) for h, c in wanted.items() if c - named.get(h, set())}
    if missing:
        raise StageFailed(f"health with the removed {LEAVING} still listed did not name {missing}")
    return "; ".join(f"{', '.join(sorted(c))} on {h}" for h, c in sorted(named.items()))


def _left_clean(out) -> str:
    """Health on the inventory without the removed Spark: no ERR, and the coordinator lists exactly the others."""
    found, seconds = health_run(out)
    errors = errors_in(found)
    stale = [c["reason"] for c in found if c["code"] == "P2P_COORDINATOR_STALE"]
    if errors or stale:
        raise StageFailed(f"health without {LEAVING} in the inventory: {', '.join(errors + stale)}")
    coordinator = next((c["reason"] for c in found if c["code"] == "P2P_COORDINATOR_OK"), None)
    if coordinator is None:
        raise StageFailed("health without the removed Spark did not check the coordinator")
    return f"health clean in {seconds:.0f} s, coordinator {coordinator}"


def _traces(t) -> list:
    """What of the removed Spark is still in the cluster: its L2 login, its address in a firewall, its units."""
    found = []
    address = SPARKS[LEAVING]
    vm = host.VM(STORAGE)
    acl = vm.ssh("cat /etc/valkey/users.acl /etc/redis/users.acl 2>/dev/null", check=False).stdout
    if f"user {t.spec.l2.user}-{LEAVING} " in acl:
        found.append(f"its L2 login {t.spec.l2.user}-{LEAVING} on {STORAGE}")
    tables = {STORAGE: vm.ssh("nft list table inet kvtier").stdout}
    tables.update({s: t.nodes[s].run("nft", "list", "table", "inet", "kvtier") for s in t.nodes if s != LEAVING})
    found += [f"its address {address} in {where}'s firewall" for where, rules in tables.items() if address in rules]
    paths = " ".join(f"/etc/systemd/system/{t.units[name]}" for name in ("lmcache", "vllm"))
    units = t.nodes[LEAVING].run("sh", "-c", f"ls {paths} 2>/dev/null || true").split()
    if units:
        found.append(f"its units on it ({', '.join(units)})")
    return found
