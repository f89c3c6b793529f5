"""Automatic repair, opt-in (`kvtier health --repair`, the health timer's `health_timer_repair`): when health names a
fault the rolling repair fixes, and nothing else is wrong, run playbooks/repair_lmcache.yml on the Sparks named.

The playbook is the operator's own: one Spark at a time behind the router, under the cluster's day-2 lock (a day-2 run
in progress makes this run skip, never wait). Every attempt is one log line and a counter by outcome in the health
textfile, so an alert can say a repair failed or keeps recurring."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import socket
import time

from kvtier.probes import health as h

# What the rolling repair fixes: LMCache 0.5.6's resp adapter, which does not reconnect after its server restarted.
REPAIRABLE = frozenset({"L2_RESTARTED_UNDER_LMCACHE", "L2_STORES_FAILING"})
PLAYBOOK = "repair_lmcache.yml"
OUTCOMES = ("repaired", "failed", "locked", "refused")
_LOCKED = "day-2 lock"


@dataclasses.dataclass(frozen=True)
class Decision:
    hosts: tuple  # the Sparks to repair, in inventory order
    blockers: tuple  # "host: CODE" of every other ERR (the repair's own health gate would refuse them)

    def __bool__(self) -> bool:
        return bool(self.hosts)


def decide(results: list) -> Decision:
    """Which Sparks the rolling repair should restart, and what else is ERR."""
    hosts, blockers = [], []
    for c in results:
        if c["status"] != h.ERR:
            continue
        if c["code"] in REPAIRABLE:
            if c["host"] not in hosts:
                hosts.append(c["host"])
        elif f"{c['host']}: {c['code']}" not in blockers:
            blockers.append(f"{c['host']}: {c['code']}")
    return Decision(tuple(hosts), tuple(blockers))


@dataclasses.dataclass
class Attempt:
    outcome: str  # one of OUTCOMES
    hosts: tuple
    seconds: float = 0.0
    detail: str = ""


def run(inventory: str, decision: Decision, vault_password_file: str = "", out=print) -> Attempt:
    """The rolling repair of `decision.hosts`, or the reason it did not run."""
    from kvtier import content, runner

    if decision.blockers:
        return Attempt("refused", decision.hosts, detail="other faults first: " + ", ".join(decision.blockers))
    extravars = {"kvtier_day2_lock_holder": f"kvtier health --repair on {socket.gethostname()}"}
    ok, _, seconds, failures = runner.run_playbook(
        content.root(),
        PLAYBOOK,
        pathlib.Path(inventory),
        out=out,
        extravars=extravars,
        limit=",".join(decision.hosts),
        vault_password_file=vault_password_file,
    )
    if ok:
        return Attempt("repaired", decision.hosts, seconds)
    locked = next((f for f in failures if _LOCKED in f and "is held by" in f), "")
    if locked:
        return Attempt("locked", decision.hosts, seconds, locked.split(": ", 2)[-1])
    return Attempt("failed", decision.hosts, seconds, "; ".join(failures) or "the playbook failed")


def describe(attempt: Attempt) -> str:
    hosts = ", ".join(attempt.hosts)
    said = {
        "repaired": f"{PLAYBOOK} repaired {hosts} in {attempt.seconds:.0f} s",
        "failed": f"{PLAYBOOK} on {hosts} FAILED after {attempt.seconds:.0f} s: {attempt.detail}",
        "locked": f"{PLAYBOOK} on {hosts} skipped: {attempt.detail}",
        "refused": f"not repairing {hosts}: {attempt.detail}",
    }
    return "kvtier health --repair: " + said[attempt.outcome]


def textfile_for(health_textfile: str) -> pathlib.Path:
    """The repair's own textfile, beside the health run's: written only when a repair is attempted (and once, with
    zeros, when there is none yet), so its last attempt's figures stay between attempts."""
    return pathlib.Path(health_textfile).with_name("kvtier-auto-repair.prom")


_COUNTER = re.compile(r'^kvtier_auto_repair_total\{outcome="(\w+)"\} (\d+)', re.M)


def previous_counts(path: pathlib.Path) -> dict:
    """{outcome: count} from the repair's textfile (zeros where it has none: Prometheus sees a counter reset)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    try:
        text = path.read_text()
    except OSError:
        return counts
    for outcome, value in _COUNTER.findall(text):
        if outcome in counts:
            counts[outcome] = int(value)
    return counts


def prometheus(counts: dict, attempt: Attempt | None, now: float | None = None) -> str:
    """Attempts by outcome (`counts`, with `attempt` added), and the attempt's own time, outcome, length and Sparks."""
    counts = dict(counts)
    if attempt:
        counts[attempt.outcome] += 1
    lines = [
        "# HELP kvtier_auto_repair_total Automatic repairs the health timer attempted, by outcome.",
        "# TYPE kvtier_auto_repair_total counter",
    ]
    lines += [f'kvtier_auto_repair_total{{outcome="{o}"}} {counts[o]}' for o in OUTCOMES]
    if attempt:
        when = time.time() if now is None else now
        lines += [
            "# HELP kvtier_auto_repair_last_timestamp_seconds When the last automatic repair ended, by its outcome.",
            "# TYPE kvtier_auto_repair_last_timestamp_seconds gauge",
            f'kvtier_auto_repair_last_timestamp_seconds{{outcome="{attempt.outcome}"}} {when:.3f}',
            "# HELP kvtier_auto_repair_last_seconds How long the last automatic repair ran.",
            "# TYPE kvtier_auto_repair_last_seconds gauge",
            f"kvtier_auto_repair_last_seconds {attempt.seconds:.1f}",
            "# HELP kvtier_auto_repair_last_sparks Sparks the last automatic repair was for.",
            "# TYPE kvtier_auto_repair_last_sparks gauge",
            f"kvtier_auto_repair_last_sparks {len(attempt.hosts)}",
        ]
    return "\n".join(lines) + "\n"


def record(health_textfile: str, attempt: Attempt | None) -> None:
    """Write the repair's textfile for `attempt`; with none, only make sure the counters exist."""
    from kvtier.health import report

    path = textfile_for(health_textfile)
    if attempt is None and path.exists():
        return
    report.write_textfile(str(path), prometheus(previous_counts(path), attempt))
