"""`kvtier bench ttft|storage -i <inventory>`: measured figures, written as JSON, CSV, PNG and HTML."""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

from kvtier import content, exits
from kvtier.bench import files, storage, ttft
from kvtier.probes import cpu
from kvtier.proof import tiers as proof_tiers

# The key a client sends to --endpoint (a tenant's at the router, or vLLM's): from the environment, never an argument.
API_KEY_ENV = "KVTIER_API_KEY"


def _ints(text: str) -> list:
    try:
        return [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None


def _target(args):
    from kvtier.inventory import Inventory
    from kvtier.nodes.target import from_inventory

    return from_inventory(Inventory(exits.inventory(args.inventory), args.vault_password_file))


def _notes(machine: dict, extra: list) -> list:
    return [f"measured on {files.machine_line(machine)}", *extra]


def run_ttft(target, out_dir: pathlib.Path, hosts, sizes, iterations, sweeps, rates, out=print, bench=None) -> list:
    """The TTFT bench on `hosts` (or through `bench`, an EndpointBench); its files in out_dir. Returns the paths."""
    max_len = target.spec.model.max_model_len if target is not None else None
    too_long = [n for n in sizes if max_len and n >= max_len]
    if too_long:
        raise ttft.BenchError(f"context sizes {too_long} do not fit max_model_len {max_len} (a reply needs a token)")
    bench = bench or ttft.TtftBench(target, out=out, iterations=iterations)
    results = [bench.run(h, sizes, sweeps, rates) for h in hosts]
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [dict(host=r["host"], **row) for r in results for row in r["summary"]]
    machine = results[0]["machine"]
    notes = _notes(
        machine,
        [
            f"model {bench.model}, chunk {bench.chunk} tokens, {iterations} iteration(s) per point",
            "TTFT timed at the first streamed token, on the Spark itself; every hit checked against LMCache's counters"
            if target is not None
            else f"TTFT timed at the first streamed token by a client of {bench.url}; hits from vLLM's usage counts",
        ],
    )
    measured = ttft.measured_load_order(results)
    written = [
        files.write_json(out_dir / "ttft.json", {"results": results, "notes": notes, "load_order": measured}),
        files.write_csv(out_dir / "ttft.csv", rows),
    ]
    written += files.write_plots(out_dir, "ttft", ttft.plots(results), "kvtier bench ttft", rows, notes)
    for line in ttft.table(results):
        out(line)
    if measured:
        # The spec renders the lower tiers fastest first by these instead of the planner's estimate.
        out(f"  kvtier_cluster.load_order.measured_s from this run: {measured}")
    return written


def _cmd_ttft(args: argparse.Namespace) -> int:
    from kvtier.inventory import InventoryError
    from kvtier.nodes.target import TargetError

    sweeps = args.sweep or [s for s in ttft.SWEEPS if s != "tiers" or (args.disruptive and not args.endpoint)]
    if "tiers" in sweeps and not args.disruptive:
        print(
            "refused: the tiers sweep empties tiers ("
            + "; ".join(f"{t}: {why}" for t, why in proof_tiers.DISRUPTIVE.items() if t != "l3")
            + "); pass --disruptive to allow it",
            file=sys.stderr,
        )
        return exits.REFUSED
    try:
        if args.endpoint:
            key = os.environ.get(API_KEY_ENV, "")
            bench = ttft.EndpointBench(args.endpoint, args.chunk_size, iterations=args.iterations, api_key=key)
            target, hosts = None, [args.endpoint]
        else:
            bench, target = None, _target(args)
            hosts = args.host or list(target.nodes)[:1]
    except (InventoryError, TargetError, exits.NoInventory) as exc:
        print(f"kvtier bench ttft: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    try:
        written = run_ttft(
            target, pathlib.Path(args.out), hosts, args.sizes, args.iterations, sweeps, args.rates, bench=bench
        )
    except (ttft.BenchError, proof_tiers.ProofError, OSError) as exc:
        print(f"kvtier bench ttft: {exc}", file=sys.stderr)
        return exits.FAILED
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def run_storage(inventory: str, out_dir: pathlib.Path, size: str, runtime: int, out=print, env=None) -> list:
    """playbooks/bench.yml on the cluster; the analysis's files in out_dir. Returns the paths written.
    `env` is added to the playbook's environment (the lab's strategy; an operator's run adds nothing)."""
    from kvtier.runner import run_playbook

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("storage-*.json"):
        old.unlink()  # a host left out of this run must not be reported from an earlier one
    extravars = {"bench_output_dir": str(out_dir.resolve()), "bench_fio_size": size, "bench_fio_runtime": runtime}
    inventory = str(pathlib.Path(inventory).resolve())  # ansible-runner runs from its own directory
    ok, _, seconds, failures = run_playbook(
        content.root(), "bench.yml", inventory, out=out, extravars=extravars, env=env
    )
    if not ok:
        raise ttft.BenchError("bench.yml failed: " + ("; ".join(failures) or "see its output"))
    records = storage.read_records(out_dir)
    if not records:
        raise ttft.BenchError(f"bench.yml ran on no host of {inventory} (groups storage and spark)")
    analysis = storage.analyse(records)
    notes = _notes(
        cpu.machine(), [f"fio 2 MiB blocks, data set {size}, reads for {runtime} s; bench.yml {seconds:.0f} s"]
    )
    notes[0] = "controller: " + notes[0] + " (the figures are the nodes' own)"
    written = [
        files.write_json(out_dir / "storage.json", {**analysis, "notes": notes, "at": time.time()}),
        files.write_csv(out_dir / "storage.csv", analysis["rows"]),
    ]
    written += files.write_plots(
        out_dir, "storage", storage.plots(analysis), "kvtier bench storage", analysis["rows"], notes
    )
    for line in storage.table(analysis):
        out(line)
    return written


def _cmd_storage(args: argparse.Namespace) -> int:
    try:
        inventory = exits.inventory(args.inventory)
    except exits.NoInventory as exc:
        print(f"kvtier bench storage: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    try:
        written = run_storage(inventory, pathlib.Path(args.out), args.size, args.runtime)
    except (ttft.BenchError, OSError, ValueError, KeyError) as exc:
        print(f"kvtier bench storage: {exc}", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def register(sub) -> None:
    bench = sub.add_parser("bench", help="measure TTFT per tier and the storage pool; JSON, CSV and plots")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)

    t = bench_sub.add_parser(
        "ttft",
        help="time to first token: cold, per tier, per hit rate",
        description=ttft.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = t.add_mutually_exclusive_group()
    exits.add_inventory_argument(where)
    where.add_argument(
        "--endpoint",
        help=f"an OpenAI-compatible URL to measure as a client (no tiers sweep); its API key from ${API_KEY_ENV}",
    )
    t.add_argument("--chunk-size", type=int, default=256, help="LMCache's chunk size behind --endpoint (default 256)")
    t.add_argument("--host", action="append", help="a Spark to measure on (repeat; default: the first Spark)")
    t.add_argument("--sizes", type=_ints, default=[256, 512, 1024, 1536], help="context sizes in tokens")
    t.add_argument("--rates", type=_ints, default=list(ttft.DEFAULT_RATES), help="hit rates in %% (hit-rate sweep)")
    t.add_argument("--iterations", type=int, default=3, help="new prompts per point (default 3)")
    t.add_argument(
        "--sweep", action="append", choices=ttft.SWEEPS, help="a sweep to run (repeat; default: all allowed)"
    )
    t.add_argument("--disruptive", action="store_true", help="allow the tiers sweep (it empties DRAM, L2 and L3 files)")
    t.add_argument("--out", default="bench-results", help="directory for the files (default ./bench-results)")
    t.add_argument("--vault-password-file", help="for vaulted inventory values (the L2 admin password)")
    t.set_defaults(func=_cmd_ttft)

    s = bench_sub.add_parser("storage", help="fio 2 MiB on the array and on each Spark over its L3 mount")
    exits.add_inventory_argument(s)
    s.add_argument("--size", default="16G", help="data set per host (default 16G: beyond a Spark's page cache)")
    s.add_argument("--runtime", type=int, default=60, help="seconds of random reads (default 60)")
    s.add_argument("--out", default="bench-results", help="directory for the files (default ./bench-results)")
    s.set_defaults(func=_cmd_storage)
