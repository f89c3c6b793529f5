"""Health check results: the four statuses, one check's result and the exit status of a run."""

from __future__ import annotations

import sys

OK, WARN, ERR, UNVERIFIED = "OK", "WARN", "ERR", "UNVERIFIED"
STATUSES = (OK, WARN, ERR, UNVERIFIED)


def check(host, tier, status, code, reason, fix="", name=""):
    """One check's result. `name` is the check's identity on its host, the same whatever its status or code (one
    metric series, one alert timer): by default the reporting function's (`l2_checks` and `_l2_checks` give `l2`)."""
    name = name or sys._getframe(1).f_code.co_name.strip("_").removesuffix("_checks")
    return {"host": host, "tier": tier, "check": name, "status": status, "code": code, "reason": reason, "fix": fix}


def exit_status(checks):
    """0 when no check is ERR, else 1."""
    return 1 if any(c["status"] == ERR for c in checks) else 0
