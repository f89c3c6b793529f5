"""Stages that inject one fault each into the serving lab, see health name it while requests keep succeeding, and
repair it (or leave it for a later stage to repair, as the chain in kvtier.lab.lab says)."""

from __future__ import annotations

import secrets
import time

from kvtier.health import checks as health_checks
from kvtier.health import report as health_report
from kvtier.lab import auto_repair, day2, load_faults, monitoring
from kvtier.lab.checks import errors_in, health_run, lookup_timeouts, router_kept
from kvtier.lab.inventory import FAULTY_SPARK, STORAGE, STORAGE_DATA_ADDRESS, proof_target
from kvtier.lab.stages import StageFailed, until
from kvtier.probes import health as health_probe
from kvtier.proof import canary, tiers
from kvtier.vm import host

# The P2P coordinator's unit (roles/vllm_lmcache/vars/main.yml); after it starts again every LMCache registers within
# a few heartbeats (the lab's is 1 s) and sees its peers after the next poll: health must be clean well within this.
COORDINATOR_UNIT = "kvtier-lmcache-coordinator.service"
# The alert an L2 adapter broken under LMCache fires (roles/monitoring's rules, from the health textfile).
ALERT = "KvtierHealthCheckFailed"


COORDINATOR_RECOVERY_S = 60.0


DRIFT_CODE = "CONFIG_DRIFT_CHUNK"


# What health names while a Spark is down (stopped, or removed but still in the inventory): on it, then on every other
# Spark, then at the coordinator.
STOPPED_CODES = ({"LMCACHE_DOWN", "VLLM_DOWN"}, {"P2P_PEER_MISSING"}, {"P2P_COORDINATOR_MISSING"})


# A stopped Spark's peers drop it after their next coordinator poll; the router takes it out after its checks.
PEER_GONE_S = 60.0


# A restarted Spark serves again (LMCache, then vLLM loads the model) well within this on the lab.
PEER_BACK_S = 600.0


# Requests sent to each Spark after L2 came back: its broken adapter then holds far less than the fs adapter.
STORES_PER_SPARK = 4


def _requests_under_fault(out, t, label: str) -> tuple:
    """(seconds of each answered request, failed count): STORES_PER_SPARK new prompts sent to every Spark."""
    proof = tiers.Proof(t, out=out)
    times, failed = [], 0
    for round_ in range(STORES_PER_SPARK):
        for spark in t.nodes:
            try:
                times.append(proof.complete(spark, proof.prompt(spark, f"{label} {round_}"))["seconds"])
            except tiers.ProofError as exc:
                failed += 1
                out(f"  {spark}: request failed: {exc}")
    out(f"  {len(times)} requests answered, {failed} failed; slowest {max(times, default=0):.2f} s")
    return times, failed


def _l3_fault(out, code: str, label: str, break_it: tuple, restore: tuple) -> str:
    """A fault of the L3 directory every Spark shares: `break_it` on one Spark, then requests to every Spark keep
    succeeding and health names `code` (ERR) on every Spark; `restore` undoes it and health is clean again."""
    t = proof_target()
    node = t.nodes[next(iter(t.nodes))]
    node.run(*break_it)
    try:
        times, failed = _requests_under_fault(out, t, label)
        found, _ = health_run(out)
    finally:
        node.run(*restore)
    named = {c["host"] for c in found if c["code"] == code and c["status"] == health_probe.ERR}
    if failed or named != set(t.nodes):
        raise StageFailed(f"{failed} request(s) failed; {code} on {sorted(named) or 'no Spark'}")
    after, _ = health_run(out)
    errors = errors_in(after)
    if errors:
        raise StageFailed(f"after `{' '.join(restore)}`: " + ", ".join(errors))
    reason = next(c["reason"] for c in found if c["code"] == code)
    return (
        f"{code} on {len(named)} Spark(s) ({reason}); 0 of {len(times)} requests failed "
        f"(slowest {max(times, default=0):.2f} s); `{' '.join(restore)}`, no ERR"
    )


def l3_not_writable(out) -> str:
    """The L3 directory loses its write permission (root may still write there: the case a root probe misses);
    health judges it as LMCache's server process. The stages after it store to L3 again."""
    t = proof_target()
    path = t.spec.l3.path
    mode = t.nodes[next(iter(t.nodes))].run("stat", "--format", "%a", path).strip()
    return _l3_fault(out, "L3_READ_ONLY", "with L3 not writable", ("chmod", "a-w", path), ("chmod", mode, path))


def l3_dir_gone(out) -> str:
    """The L3 directory disappears under LMCache (moved aside, so its objects are kept and come back): LMCache's fs
    adapter creates its directory only when it starts, so every store fails from then on while requests succeed."""
    path = proof_target().spec.l3.path
    aside = f"{path}.kvtier-fault"
    return _l3_fault(out, "L3_DIR_MISSING", "with the L3 directory gone", ("mv", path, aside), ("mv", aside, path))


def coordinator_stopped(out) -> str:
    """The P2P coordinator stops: requests to every Spark keep succeeding (an unregistered LMCache looks up no peer),
    health names P2P_COORDINATOR_DOWN on its host and P2P_NOT_REGISTERED on every Spark. Once it starts again, each
    LMCache registers on its own (its heartbeat is refused as unknown and it registers again; nothing restarts), so
    health must be clean again within COORDINATOR_RECOVERY_S."""
    t = proof_target()
    where = t.spec.p2p.coordinator.node
    if where not in t.nodes:
        raise StageFailed(f"the lab's coordinator runs on {where}, not on a Spark this stage can reach")
    node = t.nodes[where]
    node.run("systemctl", "stop", COORDINATOR_UNIT)
    try:
        times, failed = _requests_under_fault(out, t, "with the P2P coordinator stopped")
        found, _ = health_run(out)
    finally:
        node.run("systemctl", "start", COORDINATOR_UNIT)
    down = {c["host"] for c in found if c["code"] == "P2P_COORDINATOR_DOWN" and c["status"] == health_probe.ERR}
    unregistered = {c["host"] for c in found if c["code"] == "P2P_NOT_REGISTERED" and c["status"] == health_probe.ERR}
    if failed or down != {where} or unregistered != set(t.nodes):
        raise StageFailed(
            f"{failed} request(s) failed; P2P_COORDINATOR_DOWN on {sorted(down) or 'no host'}, "
            f"P2P_NOT_REGISTERED on {sorted(unregistered) or 'no Spark'}"
        )
    started = time.monotonic()
    while True:
        errors = errors_in(health_checks.run(t)[0])
        back = time.monotonic() - started
        if not errors:
            break
        if back > COORDINATOR_RECOVERY_S:
            raise StageFailed(f"{back:.0f} s after the coordinator started again: " + ", ".join(errors))
        time.sleep(2)
    return (
        f"P2P_COORDINATOR_DOWN on {where}, P2P_NOT_REGISTERED on {len(unregistered)} Spark(s); 0 of {len(times)} "
        f"requests failed (slowest {max(times, default=0):.2f} s); every LMCache registered again by itself, "
        f"no ERR {back:.0f} s after the coordinator started"
    )


def named_errors(found: list, codes) -> dict:
    """{host: the codes of `codes` that are ERR there}."""
    named: dict = {}
    for c in found:
        if c["status"] == health_probe.ERR and c["code"] in codes:
            named.setdefault(c["host"], set()).add(c["code"])
    return named


def _chunk_drift(t, spark: str) -> str:
    """Double the chunk size in `spark`'s LMCache unit by hand (an edit outside kvtier), applied at its next start."""
    node, chunk = t.nodes[spark], t.spec.lmcache.chunk_size
    unit = f"/etc/systemd/system/{t.units['lmcache']}"
    node.run("sed", "-i", f"s/--chunk-size {chunk} /--chunk-size {chunk * 2} /", unit)
    if f"--chunk-size {chunk * 2} " not in node.run("cat", unit):
        raise StageFailed(f"{spark}: the chunk size in {unit} was not changed")
    node.run("systemctl", "daemon-reload")
    return f"chunk size {chunk} -> {chunk * 2}"


def _start_outcome(node, unit: str) -> str | None:
    """ "refused" once a start of `unit` has failed (waiting to restart, or given up), "running" once it is active,
    None while the start is still under way."""
    shown = node.run("systemctl", "show", "--property=ActiveState", "--property=SubState", unit)
    state = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    if state.get("ActiveState") == "failed" or state.get("SubState") == "auto-restart":
        return "refused"
    return "running" if state.get("ActiveState") == "active" else None


def peer_stopped(out) -> str:
    """A P2P peer stops (its LMCache server; vLLM stops with it) while a client streams requests through the router,
    and is started again with another L2 password in its secrets file; then the file is put back. No request fails:
    the router retries a refused connection on another Spark and keeps the Spark out until it serves.

    Wrong password: its unit's start gate refuses to start (LMCache would hang every request that reaches L2), and
    health names L2_AUTH from the secrets file, with LMCACHE_DOWN and VLLM_DOWN (what health names on the peers and
    at the coordinator while a Spark is down, the grow stage checks). Put back, it starts with its chunk size changed
    by hand (the next stage's fault): every code of this stage is gone."""
    t = proof_target()
    node, unit, secrets_file = t.nodes[FAULTY_SPARK], t.units["lmcache"], t.secrets_file
    refused = {FAULTY_SPARK: {"L2_AUTH", *STOPPED_CODES[0]}}
    every = set().union(*STOPPED_CODES, {"L2_AUTH"})

    def named_everywhere(codes: dict):
        def probe():
            found, _ = health_run(out)
            named = named_errors(found, every)
            return found if all(c <= named.get(h, set()) for h, c in codes.items()) else None

        return probe

    with router_kept(out), day2.under_client_stream(out, STORAGE_DATA_ADDRESS, t.model) as (stream, watch):
        began, stopping = time.monotonic(), time.time()
        node.run("systemctl", "stop", unit)
        stopping = (stopping, time.time())
        until(f"the router takes {FAULTY_SPARK} out", PEER_GONE_S, lambda: watch.last().get(FAULTY_SPARK) == "DOWN")
        gone = time.monotonic() - began
        out(f"  {FAULTY_SPARK} stopped; DOWN at the router {gone:.0f} s later")
        node.run("cp", "-p", secrets_file, f"{secrets_file}.kvtier-fault")
        password = secrets.token_hex(16)  # refused by the L2 server, never shown
        node.run("sed", "-i", f's/^LMCACHE_RESP_PASSWORD=.*/LMCACHE_RESP_PASSWORD="{password}"/', secrets_file)
        node.run("systemctl", "start", "--no-block", unit)
        state = until(f"{unit} refused to start or running", PEER_GONE_S, lambda: _start_outcome(node, unit))
        if state == "running":
            raise StageFailed(f"{unit} runs with a login the L2 server refuses: its start gate let it through")
        gated = until("health names the refused login", PEER_GONE_S, named_everywhere(refused))
        drift = _chunk_drift(t, FAULTY_SPARK) + "; " + load_faults.inject(t, FAULTY_SPARK)
        node.run("mv", f"{secrets_file}.kvtier-fault", secrets_file)
        started = time.monotonic()
        node.run("systemctl", "start", unit)
        until(f"{FAULTY_SPARK} UP at the router", PEER_BACK_S, lambda: watch.last().get(FAULTY_SPARK) == "UP")
        back = time.monotonic() - started
    streamed = day2.report(out, stream, watch, leaving={FAULTY_SPARK}, stopping=stopping)
    after, _ = health_run(out)
    left = named_errors(after, every)
    if left:
        raise StageFailed(f"after {FAULTY_SPARK} started again: {left}")
    return (
        f"stopped: DOWN at the router {gone:.0f} s after the stop; wrong L2 password: the unit refused to start, "
        f"{', '.join(sorted(named_errors(gated, every)[FAULTY_SPARK]))} on {FAULTY_SPARK}; {streamed}; file put back "
        f"and started ({drift}), UP at the router after {back:.0f} s, no code of this stage left"
    )


def drifted_spark(out) -> str:
    """The Spark the previous stage started again runs with its chunk size changed by hand and LMCache's fault_inject
    adapter first: requests to every Spark keep succeeding (its cache keys differ, so it shares nothing with the
    others: zero hits, no error), its repeats whose chunk loads fail are answered as cold (kvtier.lab.load_faults),
    and health names CONFIG_DRIFT_CHUNK, on it only, and no other ERR. site.yml's next run (the spec-change stage)
    writes the unit again and restarts it behind the router."""
    t = proof_target()
    times, failed = _requests_under_fault(out, t, "with a Spark drifted")
    faults = load_faults.served(out, t, FAULTY_SPARK)
    found, _ = health_run(out)
    named = named_errors(found, {c["code"] for c in found})
    if failed or named != {FAULTY_SPARK: {DRIFT_CODE}}:
        raise StageFailed(
            f"{failed} request(s) failed; ERR {named or 'nowhere'}, expected {DRIFT_CODE} on {FAULTY_SPARK} only"
        )
    reason = next(c["reason"] for c in found if c["code"] == DRIFT_CODE)
    return (
        f"{DRIFT_CODE} on {FAULTY_SPARK} only ({reason}); 0 of {len(times)} requests failed (slowest "
        f"{max(times, default=0):.2f} s); failing loads: {faults}; site.yml's next run repairs both"
    )


def _stop_l2_server(vm: host.VM) -> str:
    """Stop whichever L2 server the storage node runs (Valkey or Redis); its unit name."""
    found = vm.ssh(
        "for u in valkey-server redis-server; do systemctl is-enabled --quiet $u 2>/dev/null && echo $u; done"
    ).stdout.split()
    if len(found) != 1:
        raise StageFailed(f"expected one enabled L2 server unit on {STORAGE}, found {found or 'none'}")
    vm.ssh(f"systemctl stop {found[0]}")
    return found[0]


def l2_stopped(out) -> str:
    """The L2 server stops and stays down until the storage node's reboot (the next stage) starts it again: requests
    to every Spark keep succeeding (a refused connection fails LMCache's stores and loads at once), and health names
    L2_DOWN on every Spark, probed from the Spark with LMCache's credentials."""
    t = proof_target()
    unit = _stop_l2_server(host.VM(STORAGE))
    times, failed = _requests_under_fault(out, t, "with the L2 server stopped")
    found, _ = health_run(out)
    named = {c["host"] for c in found if c["code"] == "L2_DOWN" and c["status"] == health_probe.ERR}
    if failed or not set(t.nodes) <= named:
        raise StageFailed(f"{failed} request(s) failed; L2_DOWN on {sorted(named) or 'no host'}")
    return (
        f"{unit} stopped: L2_DOWN on {len(set(t.nodes) & named)} Spark(s); 0 of {len(times)} requests failed "
        f"(slowest {max(times, default=0):.2f} s); the reboot starts it again"
    )


def l2_came_back(out, l2_back: float | None = None) -> str:
    """After the storage node's reboot emptied and restarted L2: requests keep succeeding, health names the broken
    LMCache adapter on every Spark (L2_RESTARTED_UNDER_LMCACHE, L2_STORES_FAILING where the counters show it, and a
    canary's L2 step), and the health timer's alert fires. Then the timer, switched to repair, heals it with nobody
    acting (playbooks/repair_lmcache.yml, the rolling restart in repair mode) while a client streams requests
    through the router: health is clean and the alert resolves without another run."""
    t = proof_target()
    times, failed = _requests_under_fault(out, t, "after the L2 restart")
    found, _ = health_run(out)
    named = {c["host"] for c in found if c["code"] == "L2_RESTARTED_UNDER_LMCACHE"}
    failing = {c["host"] for c in found if c["code"] == "L2_STORES_FAILING"}
    if failed or named != set(t.nodes):
        raise StageFailed(f"{failed} request(s) failed; L2_RESTARTED_UNDER_LMCACHE on {sorted(named) or 'no Spark'}")
    # Seen through LMCache itself: a canary's L2 step fails on every Spark (its adapter stores or loads nothing).
    seen = canary.Canary(t, out=out, store_timeout=15).run()
    for line in health_report.table(seen).splitlines():
        out("  " + line)
    l2_caught = {c["host"] for c in seen if c["tier"] == "l2" and c["status"] == health_probe.ERR}
    if l2_caught != set(t.nodes):
        raise StageFailed(f"the canaries saw the broken L2 adapter on {sorted(l2_caught) or 'no Spark'} only")
    # The operator's view: the health timer's run on ops01 turns the fault into an alert in Prometheus.
    # `l2_back`: when the storage node's reboot stage proved L2 back (the fault's start, as near as the lab knows it).
    health_seconds = monitoring.run_health_now()
    fired = monitoring.wait_for(ALERT, {"tier": "l2"}, set(t.nodes), firing=True)
    since = f"{time.time() - l2_back:.0f} s after L2 came back, " if l2_back else ""
    out(f"  {ALERT} (tier l2) firing for every Spark: {since}{fired:.0f} s after a {health_seconds:.0f} s health run")
    attempt, switched, streamed = auto_repair.heal(out, t.model)
    healed = attempt["ended"] - switched
    out(
        f"  the health timer repaired every Spark {healed:.0f} s after its repair was switched on "
        f"(the rolling repair itself {attempt['seconds']:.0f} s)"
    )
    # The repair's own health run wrote a clean textfile: the alert resolves with nobody starting another.
    resolved = monitoring.wait_for(ALERT, {"tier": "l2"}, set(t.nodes), firing=False)
    out(f"  {ALERT} (tier l2) resolved {resolved:.0f} s after the stage saw the repair")
    found, _ = health_run(out)
    errors = errors_in(found)
    if errors:
        raise StageFailed("after the automatic repair: " + ", ".join(errors))
    # Each Spark left the P2P group before its LMCache stopped: no peer waited on it.
    lookup_timeouts(out, switched)
    panels = monitoring.panels_answer(out)
    codes = sorted({c["code"] for c in seen if c["tier"] == "l2" and c["status"] == health_probe.ERR})
    return (
        f"L2_RESTARTED_UNDER_LMCACHE on {len(named)}, L2_STORES_FAILING on {len(failing)} Spark(s), canaries "
        f"{'/'.join(codes)} on {len(l2_caught)}; "
        f"0 of {len(times)} requests failed (slowest {max(times, default=0):.2f} s); {ALERT} firing "
        f"{since}{fired:.0f} s after a health run; the timer's automatic repair healed every Spark "
        f"{healed:.0f} s after it was switched on (repair_lmcache.yml {attempt['seconds']:.0f} s): {streamed}; "
        f"no ERR, no P2P lookup timed out; the alert resolved {resolved:.0f} s after; {panels}"
    )
