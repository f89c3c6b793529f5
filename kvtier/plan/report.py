"""The plan as data (for --json) and as the table an operator reads."""

from __future__ import annotations

from kvtier.cluster.memory import GIB, Budget
from kvtier.plan import hardware as hw
from kvtier.plan import tiers as tier_plan
from kvtier.plan.model import ModelKV

DEFAULT_CONTEXTS = (1024, 4096, 16384, 32768)
# The L3 evictor removes chunks down to this share of its budget (roles/l3_evictor: l3_evictor_low_watermark).
L3_LOW_WATERMARK = 0.75


def l3_retention(capacity_bytes: float, prefill: float, model: ModelKV, sparks: int, store_gbs: float | None) -> dict:
    """How long L3 keeps a chunk nobody reads again: the evictor's low watermark of the pool, divided by the rate new
    chunks arrive (given, or every Spark prefilling new context at its full rate: the fastest the pool can turn)."""
    worst = sparks * prefill * model.bytes_per_token / 1e9
    rate = store_gbs if store_gbs else worst
    basis = "given" if store_gbs else f"{sparks} Sparks each storing what it prefills at {prefill:,.0f} tokens/s"
    return {
        "store_gbs": rate,
        "basis": basis,
        "seconds": L3_LOW_WATERMARK * capacity_bytes / (rate * 1e9),
        "low_watermark": L3_LOW_WATERMARK,
    }


def _shared(model: ModelKV, hardware: hw.Hardware, chunk_size: int) -> list:
    """L2's and L3's shared ceilings with one storage node and with the hardware's number, by tier."""
    found = [s for n in {1, hardware.storage_nodes} for s in tier_plan.shared(model, hardware, chunk_size, n)]
    return sorted(found, key=lambda s: (s.tier, s.storage_nodes))


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def build(
    model: ModelKV,
    hardware: hw.Hardware,
    budget: Budget,
    chunk_size: int,
    contexts=DEFAULT_CONTEXTS,
    l3_store_gbs: float | None = None,
) -> dict:
    prefill, prefill_basis = tier_plan.prefill_rate(model, hardware)
    rows = []
    for tier in tier_plan.tiers(model, hardware, budget, chunk_size):
        rows.append(
            {
                "tier": tier.tier,
                "label": tier.label,
                "capacity_gib": tier.capacity_bytes / GIB,
                "tokens": tier.tokens(model),
                "load_gbs": tier.load_gbs,
                "fixed_ms": tier.fixed_s * 1000,
                "basis": tier.basis,
                "break_even_tokens": tier.break_even_tokens(model, prefill),
                "contexts": [
                    {
                        "tokens": n,
                        "load_s": tier.load_s(model, n),
                        "recompute_s": n / prefill,
                        "speedup": (n / prefill) / tier.load_s(model, n),
                    }
                    for n in contexts
                ],
            }
        )
    return {
        "model": {
            "name": model.name,
            "description": model.describe(),
            "bytes_per_token": model.bytes_per_token,
            "chunk_size": chunk_size,
            "bytes_per_chunk": model.chunk_bytes(chunk_size),
            "weights_gib": model.weights_gib,
        },
        "hardware": {
            "description": hardware.describe(),
            "drive_source": hardware.drive.source,
            "sparks": hardware.sparks,
            "storage_nodes": hardware.storage_nodes,
        },
        "prefill_tokens_per_s": prefill,
        "prefill_basis": prefill_basis,
        "tiers": rows,
        "memory": {
            "unified_gib": budget.unified_gib,
            "parts_gib": dict(budget.parts()),
            "free_gib": budget.free_gib,
            "problems": budget.problems("each Spark"),
            "vllm_flags": {
                "--kv-cache-memory-bytes": budget.kv_cache_memory_bytes,
                "--gpu-memory-utilization": budget.gpu_memory_utilization,
            },
        },
        "sources": dict(hw.SOURCES),
        "shared": [
            {
                "tier": s.tier,
                "storage_nodes": s.storage_nodes,
                "total_gbs": s.total_gbs,
                "per_spark_gbs": s.per_spark_gbs,
                "basis": s.basis,
                "context_tokens": contexts[-1],
                "load_s": contexts[-1] * model.bytes_per_token / (s.per_spark_gbs * 1e9),
                "recompute_s": contexts[-1] / prefill,
            }
            for s in _shared(model, hardware, chunk_size)
        ],
        "l3_retention": next(
            (
                l3_retention(r["capacity_gib"] * GIB, prefill, model, hardware.sparks, l3_store_gbs)
                for r in rows
                if r["tier"] == "l3"
            ),
            None,
        ),
    }


def _size(gib: float) -> str:
    return f"{gib / 1024:,.1f} TiB" if gib >= 1024 else f"{gib:,.1f} GiB"


def _tokens(n: int) -> str:
    return f"{n / 1e9:.2f} G" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def _cell(context: dict) -> str:
    load, recompute = context["load_s"] * 1000, context["recompute_s"] * 1000
    return f"{load:,.0f} / {recompute:,.0f} ms ({context['speedup']:.1f}x)"


def text(plan: dict) -> str:
    m, mem = plan["model"], plan["memory"]
    lines = [
        f"kvtier plan: {m['description']}",
        f"  {m['bytes_per_token'] / 1024:,.1f} KiB per token, {m['bytes_per_chunk'] / 2**20:,.1f} MiB per "
        f"{m['chunk_size']}-token chunk (one LMCache object)",
        f"  hardware: {plan['hardware']['description']}",
        f"  prefill: {plan['prefill_tokens_per_s']:,.0f} tokens/s, {plan['prefill_basis']}",
        "",
    ]
    contexts = [c["tokens"] for c in plan["tiers"][0]["contexts"]]
    head = f"  {'tier':<22}{'capacity':>12}{'tokens':>10}{'GB/s':>7}  " + "".join(
        f"{f'{n // 1024}k ctx: load/recompute':>28}" for n in contexts
    )
    lines += [head + f"{'break-even':>12}"]
    for row in plan["tiers"]:
        cells = "".join(f"{_cell(c):>28}" for c in row["contexts"])
        even = "never" if row["break_even_tokens"] is None else f"{row['break_even_tokens']:,} tok"
        lines.append(
            f"  {row['label']:<22}{_size(row['capacity_gib']):>12}{_tokens(row['tokens']):>10}"
            f"{row['load_gbs']:>7.1f}  {cells}{even:>12}"
        )
    lines += ["", "  where the figures come from:"]
    lines += [f"    {row['label']}: {row['basis']}" for row in plan["tiers"]]
    lines += [f"    {key}: {value}" for key, value in plan["sources"].items()]
    lines.append(f"    drive: {plan['hardware']['drive_source']}")
    shared = plan.get("shared") or []
    if shared:
        sparks = plan["hardware"]["sparks"]
        lines += ["", f"  every Spark ({sparks}) loading from one tier at once, by storage nodes:"]
        for s in shared:
            label = "L2 remote memory" if s["tier"] == "l2" else "L3 NVMe pool"
            nodes = f"{s['storage_nodes']} storage node{'s' if s['storage_nodes'] > 1 else ''}"
            lines.append(
                f"    {label:<18}{nodes:<17}{s['total_gbs']:>6.1f} GB/s in all, {s['per_spark_gbs']:>5.2f} GB/s per "
                f"Spark: a {s['context_tokens'] // 1024}k context loads in {s['load_s'] * 1000:,.0f} ms "
                f"(recompute {s['recompute_s'] * 1000:,.0f} ms)"
            )
        lines += [f"    ({s['tier']}: {s['basis']})" for s in shared if s["storage_nodes"] == 1]
    kept = plan.get("l3_retention")
    if kept:
        lines += [
            "",
            f"  L3 keeps a chunk nobody reads again for {_duration(kept['seconds'])} at {kept['store_gbs']:.2f} "
            f"GB/s of new chunks ({kept['basis']}; the evictor's low watermark, {kept['low_watermark']:.0%} of the "
            "pool); a chunk read again stays longer",
        ]
    parts = " + ".join(
        f"{key.split('.')[-1].removesuffix('_gib')} {value:.1f}" for key, value in mem["parts_gib"].items()
    )
    lines += [
        "",
        f"  unified memory per Spark ({mem['unified_gib']:g} GiB): {parts} GiB, {mem['free_gib']:.1f} GiB left",
        "  vLLM flags that fit it: " + " ".join(f"{flag} {value}" for flag, value in mem["vllm_flags"].items()),
    ]
    lines += [f"  PROBLEM: {problem}" for problem in mem["problems"]]
    return "\n".join(lines)
