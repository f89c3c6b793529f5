"""Every check of a running cluster: per Spark, the storage node, and across nodes (what makes cache keys equal)."""

from __future__ import annotations

import concurrent.futures

from kvtier.cluster import fingerprint, load_order, render
from kvtier.health import gather
from kvtier.nodes.target import Target
from kvtier.probes import health as h


def expectations(t: Target, host: str) -> dict:
    spec = t.spec
    return {
        "model": t.model,
        "adapters": render.tier_adapters(spec),
        "load_order": load_order.decide(spec).expectation(),
        "p2p_peers": render.p2p_peers(spec),
        "l2": spec.l2 is not None,
        "l3": spec.l3 is not None,
        "rdma_fabric": t.rdma_fabric.get(host, True),
        "mtu": t.fabric.get(host, {}).get("mtu"),
        "io_size": t.fabric.get(host, {}).get("io_size"),
    }


def spark_checks(t: Target, host: str, facts: dict) -> list:
    if facts.get("error"):
        return [
            h.check(
                host,
                "serving",
                h.UNVERIFIED,
                "NODE_UNREACHABLE",
                f"no check could run: {facts['error']}",
                "reach the node as the inventory says (ssh user, key, become)",
                name="node",
            )
        ]
    return h.spark_checks(host, facts, expectations(t, host))


def storage_checks(t: Target, facts: dict) -> list:
    name = getattr(t.storage, "name", "storage")
    if facts.get("error"):
        return [
            h.check(
                name,
                "storage",
                h.UNVERIFIED,
                "NODE_UNREACHABLE",
                f"the storage node was not read: {facts['error']}",
                "reach it as the inventory says",
                name="node",
            )
        ]
    arrays = (facts.get("nvme") or {}).get("md_arrays") or {}
    out = h.array_checks(name, arrays, t.array_name, facts.get("mount"))
    return out + h.fabric_checks(name, facts.get("fabric"), t.fabric.get(name, {}).get("mtu"))


def evictor_checks(t: Target, state: dict) -> list:
    name = t.l3_evictor.name
    if state.get("error"):
        return [
            h.check(
                name,
                "l3",
                h.UNVERIFIED,
                "NODE_UNREACHABLE",
                f"the L3 evictor's host was not read: {state['error']}",
                "reach it as the inventory says",
                name="evictor",
            )
        ]
    return h.evictor_checks(name, state)


def config_checks(t: Target, facts_by_host: dict) -> list:
    """Running services against the spec, each difference shown next to what the other nodes run."""
    want, want_print = render.key_settings(t.spec), fingerprint(t.spec)
    running = {
        host: {"lmcache": f.get("lmcache") or {}, "vllm": f.get("vllm") or {}}
        for host, f in sorted(facts_by_host.items())
        if not f.get("error")
    }
    settings = {host: h.key_settings(services) for host, services in running.items()}
    out = []
    for host, services in running.items():
        others = {o: s for o, s in settings.items() if o != host}
        out += h.config_checks(host, services, want, want_print, others)
    return out


def run(t: Target) -> tuple:
    """(checks, facts by host): gather from every node and evaluate every check, whatever fails."""
    # Every node at once: a health run takes as long as its slowest node, not the sum of them.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(t.nodes) + 3) as pool:
        sparks = {host: pool.submit(gather.spark, t, host) for host in t.nodes}
        storage = pool.submit(gather.storage, t) if t.spec.l3 is not None else None
        coordinator = pool.submit(gather.coordinator, t) if t.spec.p2p is not None else None
        evictor = pool.submit(gather.evictor, t) if t.l3_evictor is not None else None
        facts = {host: future.result() for host, future in sparks.items()}
        storage_facts = storage.result() if storage is not None else None
    out = []
    for host in t.nodes:
        out += spark_checks(t, host, facts[host])
    if coordinator is not None:
        expected = {n.name: n.data_address for n in t.spec.nodes}
        out += h.coordinator_checks(t.spec.p2p.coordinator.node, coordinator.result(), expected)
    out += config_checks(t, facts)
    if storage_facts is not None:
        out += storage_checks(t, storage_facts)
    if evictor is not None:
        out += evictor_checks(t, evictor.result())
    return out, facts
