"""The cluster's day-2 lock (playbooks/tasks/day2_lock.yml, library/kvtier_day2_lock.py), run by Ansible on this
machine standing in for the lock's host: one run holds it, a playbook that imports another takes it once, another
run is refused with the holder named, a failed run keeps it, and only a take-over or its own token frees it."""

import json
import sys

from ._playbook import ROOT, results, run_json

PLAYS = """
- name: Outer day-2 playbook
  hosts: spark
  gather_facts: false
  tasks:
    - name: Take the lock
      ansible.builtin.import_tasks: {tasks}
      vars: {{day2_lock_state: held}}
- name: Inner day-2 playbook (imported)
  hosts: spark
  gather_facts: false
  tasks:
    - name: Take the lock again
      ansible.builtin.import_tasks: {tasks}
      vars: {{day2_lock_state: held}}
    - name: Work that fails when told to
      ansible.builtin.fail:
        msg: the work failed
      run_once: true
      when: fail_the_work | default(false) | bool
- name: The end of the run
  hosts: spark
  gather_facts: false
  tasks:
    - name: Give the lock back
      ansible.builtin.import_tasks: {tasks}
      vars: {{day2_lock_state: released}}
"""


def _run(tmp_path, *args, **extra):
    """(return code, failure messages, the lock's path, messages of the tasks that changed something)."""
    lock = tmp_path / "lib" / "day2.lock"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars: {ansible_connection: local, ansible_become: false, "
        f"ansible_python_interpreter: {sys.executable}}}\n"
        "  children:\n    storage: {hosts: {storage01: {}}}\n    spark: {hosts: {spark01: {}, spark02: {}}}\n"
    )
    playbook = tmp_path / "day2.yml"
    playbook.write_text(PLAYS.format(tasks=ROOT / "playbooks" / "tasks" / "day2_lock.yml"))
    extra = {"kvtier_day2_lock_path": str(lock), "kvtier_day2_lock_holder": "test run", **extra}
    rc, report = run_json(tmp_path, playbook, "-i", inventory, "-e", json.dumps(extra), *args)
    failed = [" ".join(str(r.get("msg")).split()) for r in results(report) if r.get("failed")]
    changed = [r.get("msg") for r in results(report) if r.get("changed")]
    return rc, failed, lock, changed


def test_a_run_takes_the_lock_once_and_gives_it_back(tmp_path):
    rc, failed, lock, changed = _run(tmp_path)
    assert rc == 0 and not failed
    assert changed == ["day-2 lock taken", "day-2 lock given back"]
    assert not lock.exists()


def test_a_failed_run_keeps_the_lock_and_the_next_run_is_refused(tmp_path):
    rc, failed, lock, _ = _run(tmp_path, fail_the_work=True)
    assert rc != 0 and failed == ["the work failed"]
    holder = json.loads((lock / "holder.json").read_text())
    assert holder["holder"] == "test run" and len(holder["token"]) == 32

    rc, failed, _, _ = _run(tmp_path, kvtier_day2_lock_holder="a second run")
    assert rc != 0 and len(failed) == 1
    assert "is held by test run (since " in failed[0] and "kvtier_day2_lock_take_over=true" in failed[0]
    assert json.loads((lock / "holder.json").read_text()) == holder  # untouched

    rc, failed, _, changed = _run(tmp_path, kvtier_day2_lock_take_over=True)
    assert rc == 0 and not failed and not lock.exists()
    assert changed[0].startswith("day-2 lock taken from test run (since ")


def test_check_mode_says_it_would_take_the_lock_and_writes_nothing(tmp_path):
    rc, failed, lock, changed = _run(tmp_path, "--check")
    assert rc == 0 and not failed
    assert changed == ["would take the day-2 lock"]
    assert not lock.parent.exists()
