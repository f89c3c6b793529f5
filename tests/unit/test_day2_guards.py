"""The day-2 playbooks' guards, run by Ansible on the controller against the good fixture inventory: a play that
restarts serving nodes refuses to start without its confirmation, and a bad step is refused, before any host is
contacted (the fixture's hosts do not exist)."""

import json
import re

from ._playbook import ROOT, results, run_json

GOOD = ROOT / "tests" / "fixtures" / "inventories" / "good"


def run(tmp_path, playbook, **extra):
    """(return code, failure messages, names of the tasks that ran on a host)."""
    args = [ROOT / "playbooks" / playbook, "-i", GOOD] + (["-e", json.dumps(extra)] if extra else [])
    rc, report = run_json(tmp_path, *args)
    ran = [t["task"]["name"] for play in report["plays"] for t in play["tasks"] if t["hosts"]]
    messages = [" ".join(str(r.get("msg", "")).split()) for r in results(report) if r.get("failed")]
    return rc, messages, ran


def test_a_rolling_restart_needs_its_confirmation(tmp_path):
    rc, messages, ran = run(tmp_path, "rolling_restart.yml")
    assert rc != 0 and ran == ["Check the confirmation and the mode"]
    assert "Run it with -e rolling_restart_confirm=yes" in messages[0]
    rc, messages, ran = run(
        tmp_path, "rolling_restart.yml", rolling_restart_confirm="yes", rolling_restart_mode="drain"
    )
    assert rc != 0 and "rolling_restart_mode must be services, reboot or upgrade (it is drain)" in messages[0]


def test_a_persistence_check_that_restarts_needs_its_confirmation(tmp_path):
    rc, messages, ran = run(tmp_path, "persistence_check.yml")
    assert rc != 0 and ran == ["Check the step", "Check the confirmation"]
    assert "Run it with -e persistence_check_confirm=yes" in messages[0]


def test_a_persistence_check_step_must_be_known(tmp_path):
    rc, messages, ran = run(tmp_path, "persistence_check.yml", persistence_check_step="both")
    assert rc != 0 and ran == ["Check the step"]
    assert messages == ["persistence_check_step must be all, store or replay (it is both)."]


def test_the_spec_change_stage_names_tasks_that_exist():
    """The lab's spec-change stage allows exactly these changed tasks: each must be a task or handler of the
    playbooks and roles site.yml runs (a renamed task would otherwise fail the stage as an unexplained change)."""
    from kvtier.lab.checks import FAULT_REPAIR_TASKS, SPEC_CHANGE_RESTART, SPEC_CHANGE_TASKS

    names = set()
    for path in [*(ROOT / "playbooks").rglob("*.yml"), *(ROOT / "roles").glob("*/*/*.yml")]:
        names |= set(re.findall(r"^\s*- name: (.+)$", path.read_text(), re.MULTILINE))
    assert SPEC_CHANGE_RESTART in SPEC_CHANGE_TASKS
    assert SPEC_CHANGE_TASKS <= names, SPEC_CHANGE_TASKS - names
    assert FAULT_REPAIR_TASKS <= names, FAULT_REPAIR_TASKS - names
