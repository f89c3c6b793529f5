"""Automatic repair's decisions and record (kvtier.health.repair): it repairs only what the rolling repair fixes and
only when nothing else is wrong, a held day-2 lock makes it skip, and every attempt is counted by outcome."""

import shutil
import subprocess

from kvtier.health import repair

from ._playbook import ROOT


def check(host, code, status="ERR", tier="l2"):
    return {"host": host, "tier": tier, "check": code.lower(), "code": code, "status": status}


def test_it_repairs_the_sparks_whose_l2_adapter_is_broken():
    found = [
        check("spark01", "L2_RESTARTED_UNDER_LMCACHE"),
        check("spark01", "L2_STORES_FAILING"),
        check("spark02", "L2_STORES_FAILING"),
        check("spark03", "L2_OK", status="OK"),
    ]
    decision = repair.decide(found)
    assert decision and decision.hosts == ("spark01", "spark02") and decision.blockers == ()


def test_nothing_to_repair_when_health_is_clean_or_only_warns():
    assert not repair.decide([check("spark01", "L2_OK", status="OK"), check("spark01", "L3_FILLING", status="WARN")])


def test_another_fault_refuses_the_repair_before_anything_runs(tmp_path):
    decision = repair.decide([check("spark01", "L2_RESTARTED_UNDER_LMCACHE"), check("spark02", "L3_DOWN", tier="l3")])
    assert decision.hosts == ("spark01",) and decision.blockers == ("spark02: L3_DOWN",)
    attempt = repair.run(
        str(tmp_path / "no-inventory.yml"), decision
    )  # refused before any playbook: no inventory needed
    assert attempt.outcome == "refused" and "spark02: L3_DOWN" in attempt.detail
    assert (
        repair.describe(attempt)
        == "kvtier health --repair: not repairing spark01: other faults first: spark02: L3_DOWN"
    )


def test_a_held_day2_lock_is_a_skip_not_a_failure(tmp_path, monkeypatch):
    """The playbook's lock task fails with the holder named: the attempt is `locked`, and says who holds it."""
    from kvtier import runner

    held = (
        "spark01: Take the day-2 lock: the day-2 lock on this host (/var/lib/kvtier/day2.lock) is held by "
        "rolling_restart.yml by ops on ops01 (since 2026-12-07 20:00:00 UTC): another day-2 run is restarting nodes"
    )
    monkeypatch.setattr(runner, "run_playbook", lambda *a, **k: (False, 0, 3.0, [held]))
    attempt = repair.run(str(tmp_path / "hosts.yml"), repair.Decision(("spark01",), ()))
    assert attempt.outcome == "locked"
    assert attempt.detail.startswith("the day-2 lock on this host (/var/lib/kvtier/day2.lock) is held by rolling")


def test_the_playbook_runs_limited_to_the_sparks_under_a_named_holder(tmp_path, monkeypatch):
    from kvtier import runner

    seen = {}

    def fake_run(repo, playbook, inventory, **kwargs):
        seen.update(repo=repo, playbook=playbook, inventory=inventory, **kwargs)
        return True, 4, 61.5, []

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    attempt = repair.run(str(tmp_path / "hosts.yml"), repair.Decision(("spark01", "spark02"), ()), "/root/.vault")
    assert (attempt.outcome, attempt.seconds) == ("repaired", 61.5)
    assert seen["playbook"] == "repair_lmcache.yml" and (seen["repo"] / "playbooks" / "repair_lmcache.yml").is_file()
    assert seen["limit"] == "spark01,spark02" and seen["vault_password_file"] == "/root/.vault"
    assert seen["extravars"]["kvtier_day2_lock_holder"].startswith("kvtier health --repair on ")
    assert (ROOT / "playbooks" / seen["playbook"]).is_file()


def test_attempts_are_counted_by_outcome_from_file_to_file(tmp_path):
    health = tmp_path / "kvtier-health.prom"
    repair.record(str(health), None)  # the counters exist before any attempt, at zero
    path = repair.textfile_for(str(health))
    assert path == tmp_path / "kvtier-auto-repair.prom"
    assert repair.previous_counts(path) == {"repaired": 0, "failed": 0, "locked": 0, "refused": 0}
    repair.record(str(health), repair.Attempt("repaired", ("spark01", "spark02"), 143.2))
    repair.record(str(health), repair.Attempt("locked", ("spark01",), 2.0, "held"))
    repair.record(str(health), None)  # a run with nothing to repair keeps the last attempt's figures
    text = path.read_text()
    assert repair.previous_counts(path) == {"repaired": 1, "failed": 0, "locked": 1, "refused": 0}
    assert 'kvtier_auto_repair_last_timestamp_seconds{outcome="locked"} ' in text
    assert "kvtier_auto_repair_last_sparks 1\n" in text and "kvtier_auto_repair_last_seconds 2.0\n" in text
    if shutil.which("promtool"):
        proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
