"""Which lower tier LMCache loads a chunk from, and whether a loaded chunk stays in its DRAM.

LMCache 0.5.6 serves a chunk that its DRAM lacks from the lowest-indexed adapter that holds it (the order of the
``--l2-adapter`` flags), so kvtier renders the lower tiers fastest first. "Fastest" is, in order of precedence:
an explicit ``load_order.tiers``; measured seconds (``load_order.measured_s``, such as a `kvtier bench ttft`
result); else the planner's load time of one chunk of the spec's model from each tier on the planner's
hardware (the design's storage node and 100GbE fabric; `kvtier.plan.hardware`).

Retention (LMCache's ``--l2-prefetch-policy retain``) keeps a chunk loaded from a lower tier in DRAM, so its next
hit costs an L0 load instead of another transfer; what it evicts is still held by L2/L3 (every chunk is stored to
every adapter), and LMCache does not store a loaded chunk again. It pays when the fastest lower tier loads a
chunk at least `RETAIN_RATIO` times slower than DRAM; a node whose DRAM is small for its working set may turn it
off (``load_order.retain: false``) so one-off reads do not push out its hot entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.cluster import memory
from kvtier.cluster.spec import ClusterSpec
from kvtier.plan import hardware as plan_hardware
from kvtier.plan import model as plan_model
from kvtier.plan import tiers as plan_tiers

LOWER_TIERS = ("l2", "l3")
RETAIN_RATIO = 2.0
# A chunk of a model the planner does not ship is sized at LMCache's largest measured L2 value (8 MB), where its
# L2 GET rate is lowest: the order it gives holds for every chunk larger than 4 MB.
UNKNOWN_CHUNK_BYTES = 8 * 10**6


@dataclass(frozen=True)
class LoadOrder:
    tiers: tuple  # the enabled lower tiers, in the order LMCache looks them up
    seconds: dict  # tier -> seconds to load one chunk (estimated or measured), l0 included when known
    basis: str  # "explicit", "measured" or "estimated"
    retain: bool
    retain_basis: str

    def fastest_first(self) -> tuple:
        """The enabled lower tiers sorted by their load time (an explicit order aside)."""
        return tuple(sorted((t for t in self.tiers if t in self.seconds), key=lambda t: self.seconds[t]))

    def expectation(self) -> dict:
        """What health compares the running order with (`kvtier.probes.health.load_order_checks`)."""
        return {"fastest_first": list(self.fastest_first()), "seconds": dict(self.seconds), "basis": self.basis}

    def describe(self) -> str:
        times = ", ".join(f"{t} {self.seconds[t] * 1000:.3g} ms" for t in self.tiers if t in self.seconds)
        return f"{' then '.join(self.tiers)} ({self.basis}{': ' + times if times else ''})"


def _model(spec: ClusterSpec) -> plan_model.ModelKV | None:
    wanted = spec.model.id.rsplit("/", 1)[-1].lower()
    for name in plan_model.shipped():
        if name.lower() == wanted:
            return plan_model.load(name, spec.model.kv_cache_dtype)
    return None


def estimated_seconds(spec: ClusterSpec, hardware: plan_hardware.Hardware | None = None) -> dict:
    """Seconds to load one chunk from L0 and from each enabled lower tier, by the planner."""
    hardware = hardware or plan_hardware.Hardware()
    model = _model(spec)
    chunk = spec.lmcache.chunk_size
    if model is None:
        model = _Sized(UNKNOWN_CHUNK_BYTES / chunk)
    budget = memory.Budget(
        unified_gib=hardware.unified_gib,
        os_reserve_gib=0.0,
        runtime_overhead_gib=0.0,
        weights_gib=0.0,
        l0_dram_gib=spec.lmcache.l0_dram_gib,
        gpu_kv_cache_gib=0.0,
    )
    by_name = {t.tier: t for t in plan_tiers.tiers(model, hardware, budget, chunk)}
    return {t: by_name[t].load_s(model, chunk) for t in ("l0", *LOWER_TIERS) if t == "l0" or spec.has(t)}


class _Sized:
    """A model of unknown geometry with a given KV size per token (only what the tier estimates read)."""

    def __init__(self, bytes_per_token: float):
        self.bytes_per_token = bytes_per_token

    def chunk_bytes(self, chunk_size: int) -> int:
        return int(self.bytes_per_token * chunk_size)


def decide(spec: ClusterSpec) -> LoadOrder:
    """The rendered order of the lower tiers and the retention policy, with the figures behind them."""
    enabled = tuple(t for t in LOWER_TIERS if spec.has(t))
    settings = spec.load_order
    estimate = estimated_seconds(spec)
    if settings.measured_s:
        seconds, basis = dict(settings.measured_s), "measured"
    else:
        seconds, basis = {t: estimate[t] for t in enabled}, "estimated"
    if settings.tiers:
        order, basis = tuple(settings.tiers), "explicit"
    else:
        order = tuple(sorted(enabled, key=lambda t: (seconds[t], LOWER_TIERS.index(t))))
    l0 = seconds.get("l0", estimate["l0"])
    if settings.retain is not None:
        retain, retain_basis = settings.retain, "load_order.retain"
    elif not order:
        retain, retain_basis = False, "no lower tier"
    else:
        first = seconds.get(order[0], estimate[order[0]])
        ratio = first / l0 if l0 > 0 else float("inf")
        retain = ratio >= RETAIN_RATIO
        retain_basis = f"{order[0]} loads a chunk {ratio:.3g}x slower than DRAM (retain from {RETAIN_RATIO:g}x)"
    return LoadOrder(order, {"l0": l0, **seconds}, basis, retain, retain_basis)
