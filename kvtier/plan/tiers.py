"""What each tier holds and what it buys: tokens per tier, load time against recomputing, break-even context.

A context of N tokens loads from a tier in `fixed + N x bytes_per_token / bandwidth` and is recomputed in
`N / prefill_rate`; a tier pays off above the context length where the two meet, and never when loading a
token takes longer than computing it. The fixed costs are assumptions (printed as such); bandwidths are the
hardware's ceilings (vendor or measured figures from the hardware file).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.cluster.memory import GIB, Budget
from kvtier.plan.hardware import SPARK_USEFUL_TFLOPS, Hardware, l2_get_gbs
from kvtier.plan.model import ModelKV, PlanError


@dataclass(frozen=True)
class Tier:
    tier: str  # kvtier's name: l0, l1_p2p, l2, l3
    label: str
    capacity_bytes: float
    load_gbs: float
    fixed_s: float
    basis: str  # where the bandwidth and the fixed cost come from

    def tokens(self, model: ModelKV) -> int:
        return int(self.capacity_bytes // model.bytes_per_token)

    def load_s(self, model: ModelKV, tokens: int) -> float:
        return self.fixed_s + tokens * model.bytes_per_token / (self.load_gbs * 1e9)

    def break_even_tokens(self, model: ModelKV, prefill_tokens_per_s: float) -> int | None:
        """The shortest context that loads faster than it recomputes; None when loading never wins."""
        gain_per_token = 1 / prefill_tokens_per_s - model.bytes_per_token / (self.load_gbs * 1e9)
        if gain_per_token <= 0:
            return None
        return max(1, int(self.fixed_s / gain_per_token) + 1)


def prefill_rate(model: ModelKV, hardware: Hardware) -> tuple:
    """(tokens/s, how it was obtained)."""
    if hardware.prefill_tokens_per_s:
        return hardware.prefill_tokens_per_s, "given"
    if model.parameters is None:
        raise PlanError(
            f"{model.name}: its parameter count is unknown, so its prefill rate cannot be estimated: "
            f"give --prefill-rate (tokens/s: a cold request's prompt tokens over its time to first token)"
        )
    return SPARK_USEFUL_TFLOPS * 1e12 / (2 * model.parameters), "estimated (see sources)"


def _l2_gbs(model: ModelKV, hardware: Hardware, chunk_size: int) -> float:
    """One Spark loading from L2: LMCache's GET rate for its chunk size, or the link, the lower."""
    return min(hardware.nic_gbs, l2_get_gbs(model.chunk_bytes(chunk_size)))


def _l3_gbs(hardware: Hardware) -> float:
    """One array read over NFS/RDMA: the array, or the link at RDMA efficiency, the lower."""
    return min(hardware.nic_gbs * hardware.rdma_efficiency, hardware.drives * hardware.drive.read_gbs)


def tiers(model: ModelKV, hardware: Hardware, budget: Budget, chunk_size: int) -> tuple:
    rdma = hardware.nic_gbs * hardware.rdma_efficiency
    chunk = model.chunk_bytes(chunk_size)
    peers = hardware.sparks - 1
    return (
        Tier(
            "l0",
            "L0 local DRAM",
            budget.l0_dram_gib * GIB,
            hardware.memory_gbs / 2,
            0.0,
            "half the unified memory's bandwidth (a copy reads and writes it)",
        ),
        Tier(
            "l1_p2p",
            f"L1 peer ({peers} peer{'s' if peers != 1 else ''})",
            peers * budget.l0_dram_gib * GIB,
            min(rdma, hardware.memory_gbs / 2),
            0.002,
            "the fabric at RDMA efficiency; 2 ms assumed for the lookup RPC and the NIXL transfer set-up",
        ),
        Tier(
            "l2",
            "L2 remote memory",
            hardware.storage_nodes * hardware.l2_gib * GIB,
            _l2_gbs(model, hardware, chunk_size),
            0.001,
            f"LMCache's measured GET rate for {chunk / 2**20:.0f} MiB chunks ({l2_get_gbs(chunk):g} GB/s) or the "
            f"NIC, the lower; 1 ms assumed for the key lookups",
        ),
        Tier(
            "l3",
            "L3 NVMe pool",
            hardware.storage_nodes * hardware.drives * hardware.drive.capacity_tb * 1e12 * hardware.l3_fill,
            _l3_gbs(hardware),
            0.001,
            f"the array ({hardware.drives} x {hardware.drive.read_gbs:g} GB/s) or the fabric at RDMA efficiency, "
            f"the lower; 1 ms assumed for the file opens",
        ),
    )


@dataclass(frozen=True)
class Shared:
    """What the storage side serves when every Spark loads from one tier at once."""

    tier: str
    storage_nodes: int
    total_gbs: float  # every storage node's ceiling, added up
    per_spark_gbs: float  # each Spark's share, at most what one Spark can load by itself
    basis: str


def shared(model: ModelKV, hardware: Hardware, chunk_size: int, storage_nodes: int) -> tuple:
    """L2 and L3 when all the Sparks load at once from `storage_nodes` storage nodes: each node serves at most its own
    link (and, for L3, its array); the Sparks share the sum (keys and files spread evenly over the nodes)."""
    node = {
        "l2": (
            hardware.nic_gbs,
            _l2_gbs(model, hardware, chunk_size),
            f"each node's {hardware.nic_gbit:g}GbE link (one Valkey shard per node)",
        ),
        "l3": (_l3_gbs(hardware), _l3_gbs(hardware), "each node's array or its link at RDMA efficiency, the lower"),
    }
    out = []
    for tier, (gbs, one_spark, basis) in node.items():
        total = storage_nodes * gbs
        out.append(Shared(tier, storage_nodes, total, min(total / hardware.sparks, one_spark), basis))
    return tuple(out)
