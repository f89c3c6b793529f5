"""`kvtier bench storage`: the L3 fio profile on the array and on each Spark through its mount (playbooks/bench.yml).

The playbook runs fio and leaves one JSON record per host; this module reads them and puts each Spark's
throughput against the array's own figure and against its data link's line rate (what the network could carry).
"""

from __future__ import annotations

import json
import pathlib

MIB = 2**20


def throughput(record: dict) -> dict:
    """Sequential write and random read MiB/s of one host's fio record (the profile's two jobs)."""
    jobs = {job["jobname"]: job for job in record["fio"]["jobs"]}
    write, read = jobs["seq-write"]["write"], jobs["rand-read"]["read"]
    errors = [f"{name}: error {job['error']}" for name, job in jobs.items() if job.get("error")]
    return {
        "write_mib_s": round(write["bw_bytes"] / MIB, 1),
        "read_mib_s": round(read["bw_bytes"] / MIB, 1),
        "read_iops": round(read["iops"], 1),
        "read_lat_p99_ms": round(read.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1e6, 2),
        "write_s": round(write.get("runtime", 0) / 1000, 1),  # each job's own duration: a stall shows here
        "read_s": round(read.get("runtime", 0) / 1000, 1),
        "errors": errors,
    }


def line_rate_mib_s(speed_mbps) -> float | None:
    """A link's line rate in MiB/s from its speed in Mb/s (None where the kernel does not know it)."""
    speed = int(speed_mbps or -1)
    return round(speed * 1e6 / 8 / MIB, 1) if speed > 0 else None


def _share(value: float, of: float | None) -> float | None:
    return round(value / of, 3) if of else None


def analyse(records: list) -> dict:
    """Rows per host: throughput, and each Spark's as a fraction of the array's and of its line rate."""
    storage = [r for r in records if r["role"] == "storage"]
    local = throughput(storage[0]) if storage else None
    rows = []
    for record in sorted(records, key=lambda r: (r["role"] != "storage", r["host"])):
        t = throughput(record)
        rate = line_rate_mib_s(record["link"]["speed_mbps"])
        transport = record.get("transport", "array" if record["role"] == "storage" else "nfs")
        row = {"host": record["host"], "role": record["role"], "transport": transport, "path": record["path"]}
        row.update(size=record["size"], **t, link=f"{record['link']['interface']} {record['link']['speed_mbps']} Mb/s")
        if record["role"] == "spark":
            row["write_vs_array"] = _share(t["write_mib_s"], local and local["write_mib_s"])
            row["read_vs_array"] = _share(t["read_mib_s"], local and local["read_mib_s"])
            # Only an NFS mount's traffic crosses the link; a local directory's figures are not set against it.
            row["read_vs_line_rate"] = _share(t["read_mib_s"], rate) if transport == "nfs" else None
            row["write_vs_line_rate"] = _share(t["write_mib_s"], rate) if transport == "nfs" else None
        rows.append(row)
    return {"rows": rows, "local": local}


def read_records(directory: pathlib.Path) -> list:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("storage-*.json"))]


def plots(analysis: dict) -> list:
    rows = analysis["rows"]
    where = {"array": "on the array", "nfs": "over its NFS mount", "local": "local L3 directory"}
    labels = [f"{r['host']} ({where.get(r['transport'], r['transport'])})" for r in rows]
    return [
        {
            "kind": "bar",
            "title": "L3 pool, 2 MiB blocks (fio)",
            "xlabel": "",
            "ylabel": "MiB/s",
            "categories": labels,
            "series": {
                "sequential write": [r["write_mib_s"] for r in rows],
                "random read": [r["read_mib_s"] for r in rows],
            },
        }
    ]


def table(analysis: dict) -> list:
    lines = [f"{'host':<16} {'where':<24} {'write MiB/s':>11} {'read MiB/s':>10} {'vs array':>14} {'vs line rate':>12}"]
    for r in analysis["rows"]:
        where = f"{r['transport']} {r['path']}"
        versus = f"{r['write_vs_array'] or 0:.2f}w {r['read_vs_array'] or 0:.2f}r" if r["role"] == "spark" else "-"
        line_rate = f"{r['read_vs_line_rate']:.2f}r" if r.get("read_vs_line_rate") is not None else "-"
        lines.append(
            f"{r['host']:<16} {where:<24} {r['write_mib_s']:>11.1f} {r['read_mib_s']:>10.1f} {versus:>14} "
            f"{line_rate:>12}" + (f"  ERRORS: {'; '.join(r['errors'])}" if r["errors"] else "")
        )
    return lines
