"""kvtier's L3 evictor: keeps the shared NVMe pool under a byte budget, least recently used chunks first.

LMCache's fs adapter declares no capacity, so nothing else ever removes a chunk. Above the high watermark this
removes chunks, least recently used first, until the pool is at the low watermark. A chunk's last use is the later
of its access and modification times: on a mount that records access times (relatime, lazytime) a read counts; on
`noatime` only its write does. It never touches a chunk being written (LMCache's `.tmp*` names and directories) or
one written in the last `--min-age` seconds. A chunk removed under a reader is a failed load that LMCache recomputes.

    python3 kvtier_l3_evictor.py ROOT (--budget-bytes N | --budget-fraction F) [--high 0.9] [--low 0.75]
        [--min-age 60] [--textfile FILE]

Runs once and exits (a systemd timer repeats it); it prints one line of what it found and did.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time


@dataclasses.dataclass(frozen=True)
class Chunk:
    path: str
    size: int  # bytes on disk
    used: float  # last use: max(atime, mtime)
    written: float  # mtime


@dataclasses.dataclass
class Run:
    used_before: int = 0
    used_after: int = 0
    chunks: int = 0
    removed: int = 0
    removed_bytes: int = 0
    vanished: int = 0  # removed by someone else between the scan and the removal
    seconds: float = 0.0


def _being_written(name: str) -> bool:
    return name.startswith(".tmp") or name.endswith(".tmp")


def scan(root: str) -> list:
    """Every chunk under `root`, skipping what is being written."""
    found = []
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            if _being_written(entry.name):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            size = st.st_blocks * 512 if st.st_blocks else st.st_size
            found.append(Chunk(entry.path, size, max(st.st_atime, st.st_mtime), st.st_mtime))
    return found


def plan(chunks: list, budget: int, high: float, low: float, min_age: float, now: float) -> list:
    """The chunks to remove: none while the pool is at or under `high` of `budget`; otherwise the least recently
    used (old enough to be complete) until it is at `low`."""
    used = sum(c.size for c in chunks)
    if used <= high * budget:
        return []
    target = low * budget
    chosen = []
    for chunk in sorted(chunks, key=lambda c: (c.used, c.path)):
        if used <= target:
            break
        if now - chunk.written < min_age:
            continue
        chosen.append(chunk)
        used -= chunk.size
    return chosen


def evict(root: str, budget: int, high: float, low: float, min_age: float, now: float | None = None) -> Run:
    started = time.monotonic()
    chunks = scan(root)
    run = Run(used_before=sum(c.size for c in chunks), chunks=len(chunks))
    run.used_after = run.used_before
    for chunk in plan(chunks, budget, high, low, min_age, time.time() if now is None else now):
        try:
            os.unlink(chunk.path)
        except FileNotFoundError:
            run.vanished += 1
        else:
            run.removed += 1
            run.removed_bytes += chunk.size
        run.used_after -= chunk.size
    run.seconds = time.monotonic() - started
    return run


# Counters the textfile carries from run to run (a missing or unreadable textfile starts them at zero again, which
# Prometheus reads as a counter reset).
TOTALS = ("kvtier_l3_evictor_runs_total", "kvtier_l3_evicted_chunks_total", "kvtier_l3_evicted_bytes_total")


def previous_totals(path: str | None) -> dict:
    """The counters of the last run's textfile at `path`: {name: value}, zero where absent."""
    totals = dict.fromkeys(TOTALS, 0)
    try:
        with open(path or "") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name in totals:
                    totals[name] = int(float(value))
    except (OSError, ValueError):
        pass
    return totals


def textfile(run: Run, budget: int, high: float, low: float, now: float, before: dict | None = None) -> str:
    """node_exporter textfile metrics of this run (the pool's fill against its watermarks), with the counters of
    every run so far (`before`: those of the run before this one)."""
    before = before or dict.fromkeys(TOTALS, 0)
    rows = [
        ("kvtier_l3_used_bytes", "gauge", "Bytes of L3 chunks after the evictor's last run.", run.used_after),
        ("kvtier_l3_budget_bytes", "gauge", "The L3 pool's byte budget.", budget),
        ("kvtier_l3_high_watermark_bytes", "gauge", "Above this the evictor removes chunks.", int(high * budget)),
        ("kvtier_l3_low_watermark_bytes", "gauge", "The evictor removes chunks down to this.", int(low * budget)),
        ("kvtier_l3_chunks", "gauge", "L3 chunks found by the evictor's last run.", run.chunks),
        ("kvtier_l3_evicted_chunks", "gauge", "Chunks the evictor's last run removed.", run.removed),
        ("kvtier_l3_evicted_bytes", "gauge", "Bytes the evictor's last run removed.", run.removed_bytes),
        ("kvtier_l3_evictor_last_run_timestamp_seconds", "gauge", "When the evictor last ran.", round(now, 3)),
        ("kvtier_l3_evictor_runs_total", "counter", "Evictor runs.", before["kvtier_l3_evictor_runs_total"] + 1),
        (
            "kvtier_l3_evicted_chunks_total",
            "counter",
            "Chunks the evictor has removed.",
            before["kvtier_l3_evicted_chunks_total"] + run.removed,
        ),
        (
            "kvtier_l3_evicted_bytes_total",
            "counter",
            "Bytes the evictor has removed.",
            before["kvtier_l3_evicted_bytes_total"] + run.removed_bytes,
        ),
    ]
    lines = []
    for name, kind, text, value in rows:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return "\n".join(lines) + "\n"


def _size(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="LMCache's L3 directory (the fs adapter's base path)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget-bytes", type=int, help="the pool's byte budget")
    budget.add_argument("--budget-fraction", type=float, help="the budget as a fraction of ROOT's file system")
    parser.add_argument("--high", type=float, default=0.90, help="fraction of the budget that starts an eviction")
    parser.add_argument("--low", type=float, default=0.75, help="fraction of the budget an eviction goes down to")
    parser.add_argument("--min-age", type=float, default=60.0, help="seconds a chunk is spared after its write")
    parser.add_argument("--textfile", help="also write node_exporter textfile metrics here")
    args = parser.parse_args(argv)
    if not 0 < args.low < args.high <= 1 or args.min_age < 0:
        parser.error("need 0 < --low < --high <= 1 and --min-age >= 0")
    if (args.budget_bytes is not None and args.budget_bytes <= 0) or not 0 < (args.budget_fraction or 1) <= 1:
        parser.error("--budget-bytes must be positive, --budget-fraction in (0, 1]")
    if not os.path.isdir(args.root):
        print(f"kvtier-l3-evictor: {args.root} is not a directory (is the pool mounted?)", file=sys.stderr)
        return 2
    if args.budget_bytes is None:
        fs = os.statvfs(args.root)
        args.budget_bytes = int(args.budget_fraction * fs.f_blocks * fs.f_frsize)
    now = time.time()
    run = evict(args.root, args.budget_bytes, args.high, args.low, args.min_age, now)
    print(
        f"kvtier-l3-evictor: {args.root}: {run.chunks} chunks, {_size(run.used_before)} of "
        f"{_size(args.budget_bytes)} (high {args.high:.0%}, low {args.low:.0%}); removed {run.removed} "
        f"({_size(run.removed_bytes)}, {run.vanished} already gone), now {_size(run.used_after)}; {run.seconds:.2f} s"
    )
    if args.textfile:
        before = previous_totals(args.textfile)
        _write_atomically(args.textfile, textfile(run, args.budget_bytes, args.high, args.low, now, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
