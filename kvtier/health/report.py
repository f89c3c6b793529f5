"""Health results as a terminal table, as JSON, and as a node_exporter textfile."""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

from kvtier.probes import health as h

_ORDER = {h.ERR: 0, h.WARN: 1, h.UNVERIFIED: 2, h.OK: 3}
_VALUE = {h.OK: 0, h.WARN: 1, h.ERR: 2, h.UNVERIFIED: 3}


def table(checks: list) -> str:
    """One line per check (problems first), the fix under each problem, then a count per status."""
    width = max((len(c["host"]) for c in checks), default=4)
    lines = [f"{'host':<{width}}  {'tier':<8} {'status':<10} {'code':<28} reason"]
    for c in sorted(checks, key=lambda c: (_ORDER[c["status"]], c["host"], c["tier"], c["code"])):
        lines.append(f"{c['host']:<{width}}  {c['tier']:<8} {c['status']:<10} {c['code']:<28} {c['reason']}")
        if c["status"] in (h.ERR, h.WARN, h.UNVERIFIED) and c["fix"]:
            lines.append(f"{'':<{width}}  {'':<8} {'':<10} {'':<28} fix: {c['fix']}")
    counts = {s: sum(1 for c in checks if c["status"] == s) for s in h.STATUSES}
    lines.append(f"{len(checks)} checks: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(checks: list, facts: dict, now: float | None = None) -> str:
    """Per-check gauges and per-tier token counters, in the text format node_exporter's textfile collector reads.

    A check is one series whose labels never change with its state (host, tier, check): its status is the worst of
    its results; the code it reports now is in an info series beside it, so an alert's `for:` survives a change of
    code and a dashboard keeps one line per check."""
    worst: dict = {}
    for c in checks:
        key = (c["host"], c["tier"], c["check"])
        if key not in worst or _ORDER[c["status"]] < _ORDER[worst[key]["status"]]:
            worst[key] = c
    lines = [
        "# HELP kvtier_health_status Result of one kvtier health check: 0 OK, 1 WARN, 2 ERR, 3 UNVERIFIED.",
        "# TYPE kvtier_health_status gauge",
    ]
    for (host, tier, name), c in sorted(worst.items()):
        lines.append(
            f'kvtier_health_status{{host="{_label(host)}",tier="{tier}",check="{name}"}} {_VALUE[c["status"]]}'
        )
    lines += [
        "# HELP kvtier_health_code_info The code a kvtier health check reports now (its labels change with it).",
        "# TYPE kvtier_health_code_info gauge",
    ]
    for (host, tier, name), c in sorted(worst.items()):
        labels = f'host="{_label(host)}",tier="{tier}",check="{name}",code="{c["code"]}",status="{c["status"]}"'
        lines.append(f"kvtier_health_code_info{{{labels}}} 1")
    lines += [
        "# HELP kvtier_health_last_run_timestamp_seconds When this file's health run ended (its age says it is stale).",
        "# TYPE kvtier_health_last_run_timestamp_seconds gauge",
        f"kvtier_health_last_run_timestamp_seconds {time.time() if now is None else now:.3f}",
    ]
    # LMCache's own counters, as the health run read them (one group per metric family, as the format wants).
    families = {
        "kvtier_lookup_tokens_total": ("Prompt tokens LMCache looked up on a Spark.", []),
        "kvtier_hit_tokens_total": ("Looked-up tokens that hit, by kvtier tier (l0: LMCache's DRAM).", []),
        "kvtier_tier_loads_total": ("Loads LMCache completed from a lower tier's adapter.", []),
    }
    for host, f in sorted(facts.items()):
        s = ((f or {}).get("probe") or {}).get("lmcache")
        if not s:
            continue
        host_label = _label(host)
        families["kvtier_lookup_tokens_total"][1].append((f'host="{host_label}"', s.get("requested_tokens", 0)))
        families["kvtier_hit_tokens_total"][1].append((f'host="{host_label}",tier="l0"', s.get("l1_hit_tokens", 0)))
        families["kvtier_hit_tokens_total"][1].append((f'host="{host_label}",tier="lower"', s.get("l2_hit_tokens", 0)))
        for adapter, counts in sorted((s.get("l2") or {}).items()):
            families["kvtier_tier_loads_total"][1].append(
                (f'host="{host_label}",adapter="{_label(adapter)}"', counts.get("loads", 0))
            )
    for name, (help_text, samples) in families.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        lines += [f"{name}{{{labels}}} {value}" for labels, value in samples]
    return "\n".join(lines) + "\n"


def write_textfile(path: str, text: str) -> None:
    """Replace `path` atomically, so the collector never reads half a file."""
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".kvtier-health.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
