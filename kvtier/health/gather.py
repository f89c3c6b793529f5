"""Collect the facts the checks need, on each node, as the node sees them (read-only, nothing is changed).

Each node runs one standard-library script made of kvtier's probes (LMCache/vLLM, RESP, NFS, NVMe, health
gatherers), the same code the Ansible modules ship as module_utils; LMCache's API listens on loopback only.
"""

from __future__ import annotations

from kvtier.cluster import render
from kvtier.nodes.scripts import script
from kvtier.nodes.target import Target
from kvtier.nodes.transport import NodeError
from kvtier.probes import health as health_probe
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import nfs as nfs_probe
from kvtier.probes import nvme as nvme_probe
from kvtier.probes import resp as resp_probe

SPARK_SOURCE = script(lmcache_probe, resp_probe, nfs_probe, health_probe)
STORAGE_SOURCE = script(nvme_probe, health_probe)


def spark(t: Target, host: str) -> dict:
    """Every fact of one Spark; a node that cannot be reached gives {"error": ...}."""
    spec = t.spec
    endpoints = {"vllm": t.vllm_url(host), "lmcache_http": t.lmcache_url(host)}
    endpoints["lmcache_metrics"] = endpoints["lmcache_http"] + "/metrics"
    peers = render.p2p_peers(spec)
    parts = [
        f"probe=probe_node({endpoints!r}, {t.model!r}, 5.0, {peers!r})",
        f"lmcache=running_service({t.units['lmcache']!r})",
        f"vllm=running_service({t.units['vllm']!r})",
        # The store counters again a second later: a working adapter has caught up by then (store_gap_checks).
        f"later=summary_after({endpoints['lmcache_metrics']!r})",
    ]
    if spec.l3 is not None:
        # Writable as LMCache's server is (the probe runs as root, which may write anywhere).
        parts.append(f"l3=directory_state({spec.l3.path!r}, running_service({t.units['lmcache']!r}).get('pid'))")
        if t.rdma_fabric.get(host, True):
            parts.append(f"nfs=mount_facts(mount_point_of({spec.l3.path!r}, read(MOUNTS)))")
    if t.rdma_fabric.get(host, True) and host in t.fabric:
        parts.append(f"fabric=fabric_state({t.fabric[host]['interfaces']!r})")
    if spec.l2 is not None:
        l2 = (spec.l2.host, spec.l2.port)
        user, password = render.l2_login(spec, host, t.l2_password or "")
        if t.l2_password:
            parts.append(f"l2=client_view(*{l2!r}, {user!r}, {password!r})")
        # LMCache's own login too, where it differs from the inventory's (a secrets file changed on the node): the
        # running server's, else the one its unit starts with.
        parts.append(
            f"l2_lmcache=lmcache_l2_view(running_service({t.units['lmcache']!r}).get('pid'), "
            f"({user!r}, {password if t.l2_password else None!r}), lambda u, p: client_view(*{l2!r}, u, p), "
            f"{t.secrets_file!r})"
        )
    try:
        return t.nodes[host].python(SPARK_SOURCE, "dict(" + ", ".join(parts) + ")", timeout=120)
    except (NodeError, ValueError) as exc:
        return {"error": str(exc)}


def storage(t: Target) -> dict:
    """The storage node's array, its mount and its RoCE interfaces; {"error": ...} when it cannot be read."""
    if t.storage is None:
        return {"error": "the inventory has no single storage node"}
    interfaces = t.fabric.get(t.storage.name, {}).get("interfaces")
    call = (
        f"(lambda n: dict(nvme=n, mount=array_mount_state(n.get('md_arrays'), {t.array_name!r}), "
        f"fabric=fabric_state({interfaces!r}) if {interfaces!r} else None))(collect())"
    )
    try:
        return t.storage.python(STORAGE_SOURCE, call, timeout=120)
    except (NodeError, ValueError) as exc:
        return {"error": str(exc)}


def coordinator(t: Target) -> dict:
    """The P2P coordinator's instances, read from a Spark on the data network (the coordinator's own node when it
    is a Spark); {"error": ...} when no Spark could ask."""
    c = t.spec.p2p.coordinator
    via = c.node if c.node in t.nodes else sorted(t.nodes)[0]
    try:
        return t.nodes[via].python(SPARK_SOURCE, f"coordinator_state({c.url!r})", timeout=60)
    except (NodeError, ValueError) as exc:
        return {"url": c.url, "error": f"asked from {via}: {exc}"}


def evictor(t: Target) -> dict:
    """The L3 evictor's last run, read on its host (a Spark, the storage node or another); {"error": ...} when that
    host cannot be read."""
    try:
        return t.l3_evictor.python(STORAGE_SOURCE, f"evictor_state({t.l3_evictor_textfile!r})", timeout=60)
    except (NodeError, ValueError) as exc:
        return {"error": str(exc)}
