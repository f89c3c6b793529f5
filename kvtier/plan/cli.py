"""`kvtier plan --model NAME|config.json [--hardware FILE] [--json]`: size the tiers before buying drives."""

from __future__ import annotations

import argparse
import json
import sys

from kvtier.cluster.memory import Budget
from kvtier.plan import hardware, model, report


def _cmd_plan(args: argparse.Namespace) -> int:
    try:
        kv = model.load(args.model, args.kv_cache_dtype)
        hw = hardware.load(
            args.hardware, prefill_tokens_per_s=args.prefill_rate, sparks=args.sparks, storage_nodes=args.storage_nodes
        )
        weights = args.weights_gib if args.weights_gib is not None else kv.weights_gib
        if weights is None:
            raise model.PlanError(
                f"{kv.name}: the weights' size cannot be computed from its config: give --weights-gib"
            )
        budget = Budget(
            hw.unified_gib, weights, args.gpu_kv_gib, args.l0_dram_gib, args.runtime_overhead_gib, args.os_reserve_gib
        )
        if args.l3_store_gbs is not None and args.l3_store_gbs <= 0:
            raise model.PlanError("--l3-store-gbs must be a positive rate (GB/s of new chunks stored)")
        contexts = tuple(args.context or report.DEFAULT_CONTEXTS)
        plan = report.build(kv, hw, budget, args.chunk_size, contexts, l3_store_gbs=args.l3_store_gbs)
    except model.PlanError as exc:
        print(f"kvtier plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=2) if args.json else report.text(plan))
    return 1 if plan["memory"]["problems"] else 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="size the tiers for a model and hardware: tokens per tier, load vs recompute")
    p.add_argument("--model", required=True, help=f"a config.json or one that ships: {', '.join(model.shipped())}")
    p.add_argument("--hardware", help="YAML/JSON file with the hardware (see kvtier/plan/hardware.py)")
    p.add_argument("--prefill-rate", type=float, help="measured prefill tokens/s (default: estimated for a Spark)")
    p.add_argument("--sparks", type=int, help="number of Sparks (default 4)")
    p.add_argument(
        "--storage-nodes",
        type=int,
        help="number of storage nodes: L2 a Valkey Cluster across them, L3 one array each (default 1)",
    )
    p.add_argument("--chunk-size", type=int, default=256, help="LMCache chunk size in tokens (default 256)")
    p.add_argument("--kv-cache-dtype", default="auto", help="vLLM --kv-cache-dtype (auto: the model's dtype; fp8)")
    p.add_argument("--context", type=int, action="append", help="context length to compare (repeatable)")
    p.add_argument("--weights-gib", type=float, help="model weights (default: from the config's parameters)")
    p.add_argument("--gpu-kv-gib", type=float, default=40.0, help="vLLM's GPU KV cache per Spark (default 40)")
    p.add_argument("--l0-dram-gib", type=float, default=32.0, help="LMCache DRAM per Spark, kvtier's L0 (default 32)")
    p.add_argument("--runtime-overhead-gib", type=float, default=4.0, help="CUDA/runtime overhead (default 4)")
    p.add_argument("--os-reserve-gib", type=float, default=8.0, help="left to the OS and page cache (default 8)")
    p.add_argument(
        "--l3-store-gbs",
        type=float,
        help="GB/s of new chunks the cluster stores to L3, for how long L3 keeps one (default: every Spark's prefill)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
