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


def spark_free_memory(host: str, available_mb, held_kb: int, spec_dict: Mapping) -> list:
    """What the services will claim at start must be free now: the kernel's available memory, plus what kvtier's own
    running services hold (a re-run restarts them). vLLM refuses to start when its share is not free, and on a
    Spark other processes and the page cache take from the same unified memory."""
    spec = load_spec(spec_dict)
    parts = [(label, value) for label, value in memory_budget(spec) if label != "memory.os_reserve_gib"]
    needed = sum(value for _, value in parts)
    available, held = float(available_mb) / 1024, held_kb / 2**20
    if needed <= available + held:
        return []
    terms = " + ".join(f"{label} {value:g}" for label, value in parts)
    return [
        f"host {host}: the services need {terms} = {needed:g} GiB, but {available + held:.1f} GiB is free "
        f"({available:.1f} GiB available, ansible_facts.memory_mb.nocache.free, + {held:.1f} GiB held by kvtier's own "
        f"services): {needed - available - held:.1f} GiB short. Stop what else uses the memory, or lower "
        f"lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib"
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


def _kernel_module(path: str) -> bool:
    """True for a module the kernel package shipped (/lib/modules/<version>/kernel/...); MOFED and DKMS builds
    live under updates/ or extra/ instead."""
    parts = [p for p in str(path).split("/") if p]
    return "kernel" in parts and not {"updates", "extra"} & set(parts)


def rdma_stack(host: str, stack: Mapping) -> list:
    """NFS over RDMA needs one consistent RDMA stack: the kernel's own, or MOFED with its own rpcrdma.

    `stack`: what the preflight probe read on the host: ``ofed`` (ofed_info -s, empty without MOFED),
    ``mlx_compat`` (path of MOFED's compat module, empty without), ``rpcrdma`` (path of the rpcrdma module).
    The kernel's rpcrdma is built against the kernel's ib_core, which MOFED replaces: with MOFED it fails to
    load or breaks the mount, and MOFED's installer refuses to run while it is loaded.
    """
    ofed, compat, rpcrdma = (str(stack.get(k) or "").strip() for k in ("ofed", "mlx_compat", "rpcrdma"))
    mofed = ofed or ("MOFED" if compat else "")
    if not rpcrdma:
        where = (
            "MOFED's mlnx-nfsrdma package"
            if mofed
            else "the kernel's extra modules (linux-modules-extra-$(uname -r) on Ubuntu)"
        )
        return [
            f"host {host}: the kernel has no rpcrdma module, so NFS over RDMA cannot mount or export: install {where}"
        ]
    if mofed and _kernel_module(rpcrdma):
        return [
            f"host {host}: {mofed} is installed but rpcrdma is the kernel's own ({rpcrdma}), built against the "
            f"ib_core that MOFED replaces: NFS over RDMA fails to load or mount. Install MOFED's mlnx-nfsrdma for "
            f"this kernel, or remove MOFED and use the kernel's RDMA stack"
        ]
    if not mofed and not _kernel_module(rpcrdma):
        return [
            f"host {host}: rpcrdma comes from {rpcrdma}, not from the kernel, and no MOFED is installed (no "
            f"ofed_info, no mlx_compat): a leftover of a removed MOFED shadows the kernel's module. Remove it "
            f"(e.g. apt purge mlnx-nfsrdma-dkms) and run depmod -a"
        ]
    return []
