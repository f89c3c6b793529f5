"""Checks of the hardware, from facts gathered on reachable hosts: NVMe drives, Spark memory, the RoCE NIC."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kvtier.cluster import load_spec
from kvtier.cluster.spec import memory_budget


def storage_drives(
    host: str, drives: Iterable[Mapping], count: int, model_pattern: str, serials: Iterable[str] = ()
) -> list:
    """The array's members must exist: every serial of nvme_raid_serials, or `count` drives of the model family.

    `drives`: the nvme_facts module's ``kvtier_nvme.drives``. The drive behind / never counts.
    """
    drives = [d for d in drives if not d.get("backs_root")]
    serials = [str(s) for s in serials]
    if serials:
        have = {str(d.get("serial", "")).strip() for d in drives}
        missing = [s for s in serials if s not in have]
        if missing:
            return [
                f"host {host}: NVMe drives with serials {', '.join(missing)} (nvme_raid_serials) are not present; "
                f"found {', '.join(sorted(have)) or 'none'}: fix nvme_raid_serials or seat the drives"
            ]
        return []
    matching = [d for d in drives if re.search(model_pattern, str(d.get("model", "")))]
    if len(matching) >= count:
        return []
    models = sorted({str(d.get("model", "")).strip() for d in drives})
    return [
        f"host {host}: {len(matching)} NVMe drive(s) match nvme_raid_model_pattern {model_pattern!r}, but "
        f"nvme_raid_drive_count is {count} (models found: {', '.join(models) or 'none'}): set the pattern to "
        f"your drives' model family, or list the members in nvme_raid_serials"
    ]


def spark_memory(host: str, memtotal_mb, spec_dict: Mapping) -> list:
    """The spec's memory budget for this node must fit in the memory the node really has."""
    spec = load_spec(spec_dict)
    node = spec.node(host)
    have_gib = float(memtotal_mb) / 1024
    parts = memory_budget(spec)
    total = sum(value for _, value in parts)
    if total <= have_gib:
        return []
    terms = " + ".join(f"{label} {value:g}" for label, value in parts)
    return [
        f"host {host}: memory budget {terms} = {total:g} GiB is more than the {have_gib:.1f} GiB it has "
        f"(ansible_facts.memtotal_mb); lower lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib, and set "
        f"kvtier_unified_memory_gib to what the host has (now {node.unified_memory_gib:g})"
    ]


def nic(host: str, interfaces: Iterable[str], roce_interface: str) -> list:
    """The RoCE interface named in the inventory must exist on the host."""
    interfaces = sorted(str(i) for i in interfaces)
    if not roce_interface or roce_interface in interfaces:
        return []
    return [
        f"host {host}: roce_interface {roce_interface} is not a network interface of the host (found: "
        f"{', '.join(interfaces) or 'none'}): set roce_interface to the RoCE NIC's netdev"
    ]
