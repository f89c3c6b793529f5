"""CPU time used by a host's systemd services, from /proc (standard library only).

An idle serving node should use next to no CPU: a busy-polling transfer thread on an idle node takes a core
from the requests, and on a small machine makes every lookup late. `service_cpu_seconds()` sums user and
system time of every process per systemd unit whose name starts with a prefix; two readings some seconds
apart give each unit's share of one core.
"""

from __future__ import annotations

import os
import re

_UNIT = re.compile(r"/([^/]+\.service)(/|$)")


def unit_of(cgroup_text: str) -> str | None:
    """The systemd service a process belongs to, from its /proc/<pid>/cgroup (the innermost .service)."""
    units = [m.group(1) for line in cgroup_text.splitlines() for m in _UNIT.finditer(line.split(":", 2)[-1])]
    return units[-1] if units else None


def cpu_seconds(stat_text: str, ticks: int) -> float:
    """utime + stime of one process from its /proc/<pid>/stat (the command name may hold spaces)."""
    fields = stat_text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks  # fields 14 and 15 of proc(5), counted after ")"


def service_cpu_seconds(prefix: str = "kvtier-", proc: str = "/proc") -> dict:
    """{unit: CPU seconds used so far by its live processes} for the services named `prefix`*."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict = {}
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/cgroup") as fh:
                unit = unit_of(fh.read())
            if not unit or not unit.startswith(prefix):
                continue
            with open(f"{proc}/{pid}/stat") as fh:
                totals[unit] = totals.get(unit, 0.0) + cpu_seconds(fh.read(), ticks)
        except OSError:  # the process ended between listing and reading
            continue
    return totals


def machine(proc: str = "/proc") -> dict:
    """What a figure was measured on: CPU model, cores this host may use, memory (for every reported number)."""
    model = "unknown CPU"
    try:
        with open(os.path.join(proc, "cpuinfo")) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    model = value.strip()
                    break
    except OSError:
        pass
    memory = 0
    try:
        with open(os.path.join(proc, "meminfo")) as fh:
            memory = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:")), 0)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores, "memory_gib": round(memory / 2**30, 1)}
