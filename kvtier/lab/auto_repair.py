"""The lab's automatic repair: the health timer on ops01, switched to repair (`health_timer_repair`), heals the broken
L2 adapters after the storage node's reboot with nobody acting, while a client streams through the router. The
attempt is read from Prometheus (the repair's own metrics); the timer goes back to checking only afterwards, so no
other stage of the chain races a repair."""

from __future__ import annotations

import subprocess
import time

from kvtier.lab import day2, monitoring, operator_install
from kvtier.lab.checks import router_kept
from kvtier.lab.inventory import STORAGE_DATA_ADDRESS
from kvtier.lab.stages import StageFailed

# The timer's first run comes 10 s after it starts (OnActiveSec); the repair of two lab Sparks takes a few minutes.
TIMEOUT_S = 600


def _attempt_after(after: float) -> dict | None:
    """The automatic repair attempted after `after` (epoch seconds), as Prometheus last scraped it."""
    series = monitoring.query("kvtier_auto_repair_last_timestamp_seconds")
    found = [(float(s["value"][1]), s["metric"]["outcome"]) for s in series if float(s["value"][1]) > after]
    if not found:
        return None
    ended, outcome = max(found)
    seconds = monitoring.query("kvtier_auto_repair_last_seconds")
    return {"ended": ended, "outcome": outcome, "seconds": float(seconds[0]["value"][1]) if seconds else 0.0}


def _journal() -> str:
    return subprocess.run(
        ["podman", "exec", operator_install.CONTAINER, "journalctl", "-u", monitoring.HEALTH_UNIT, "-n", "40"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def heal(out, model: str) -> tuple:
    """Switch the health timer to repair and wait, under a client stream, until its repair ran; then switch it back.
    (the attempt: ended, outcome, seconds; when repair was switched on; the client's report)."""
    try:
        with router_kept(out), day2.under_client_stream(out, STORAGE_DATA_ADDRESS, model) as (stream, watch):
            switched = time.time()
            out(f"  {monitoring.install_health_timer(out, repair=True)}")
            deadline = time.monotonic() + TIMEOUT_S
            while (attempt := _attempt_after(switched)) is None:
                if time.monotonic() > deadline:
                    raise StageFailed(f"no automatic repair within {TIMEOUT_S} s; the timer's journal:\n{_journal()}")
                time.sleep(5)
        client = day2.report(out, stream, watch)
    finally:
        out(f"  {monitoring.install_health_timer(out)}")  # checks only again
    if attempt["outcome"] != "repaired":
        raise StageFailed(f"the automatic repair ended {attempt['outcome']}; the timer's journal:\n{_journal()}")
    return attempt, switched, client
