"""The playbook runner: counts changes, reports failures, in check mode changes nothing, adds no lab settings."""

import pathlib
import subprocess
import sys
import textwrap

from kvtier.lab.strategy import strategy_env
from kvtier.runner import run_playbook


def make_project(tmp_path, tasks: str):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "ansible.cfg").write_text("[defaults]\nstdout_callback = default\n")
    (tmp_path / "playbooks" / "site.yml").write_text(
        textwrap.dedent("""\
        - name: Test play
          hosts: all
          gather_facts: false
          tasks:
        """)
        + textwrap.indent(textwrap.dedent(tasks), "    ")
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    box:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    return inventory


def test_check_mode_reports_the_change_and_makes_none(tmp_path):
    target = tmp_path / "written"
    inventory = make_project(
        tmp_path,
        f"""\
        - name: Write a file
          ansible.builtin.copy:
            content: "hello\\n"
            dest: {target}
            mode: "0644"
        """,
    )
    lines = []
    ok, changed, _, failures = run_playbook(tmp_path, "site.yml", inventory, out=lines.append, check=True)
    assert (ok, changed, failures) == (True, 1, [])
    assert not target.exists()
    assert any("changed" in line and "Write a file" in line for line in lines)

    ok, changed, _, _ = run_playbook(tmp_path, "site.yml", inventory, out=lines.append)
    assert (ok, changed) == (True, 1)
    assert target.read_text() == "hello\n"
    assert run_playbook(tmp_path, "site.yml", inventory, out=lines.append)[:2] == (True, 0)


def test_a_change_that_no_log_hides_is_still_counted(tmp_path):
    # ansible-runner's event of a no_log task holds no `changed`: a secret rewritten on every run would pass an
    # idempotence check that reads task results alone.
    target = tmp_path / "secret"
    inventory = make_project(
        tmp_path,
        f"""\
        - name: Write a secret
          ansible.builtin.copy:
            content: "s3cret\\n"
            dest: {target}
            mode: "0600"
          no_log: true
        """,
    )
    changes, lines = [], []
    ok, changed, _, _ = run_playbook(tmp_path, "site.yml", inventory, out=lines.append, changes=changes)
    assert (ok, changed, changes) == (True, 1, ["box: 1 task(s) whose results no_log hides"])
    assert not any("s3cret" in line for line in lines)
    assert run_playbook(tmp_path, "site.yml", inventory, out=lines.append)[:2] == (True, 0)


def test_a_failure_is_returned_with_its_message(tmp_path):
    inventory = make_project(
        tmp_path,
        """\
        - name: Refuse
          ansible.builtin.fail:
            msg: the inventory is wrong
        """,
    )
    ok, changed, _, failures = run_playbook(tmp_path, "site.yml", inventory, out=lambda _: None)
    assert (ok, changed) == (False, 0)
    assert failures == ["box: Refuse: the inventory is wrong"]


def test_a_run_that_stops_before_any_task_says_why(tmp_path):
    inventory = make_project(
        tmp_path,
        """\
        - name: Broken
          ansible.builtin.no_such_module:
        """,
    )
    ok, _, _, failures = run_playbook(tmp_path, "site.yml", inventory, out=lambda _: None)
    assert not ok
    assert any("no_such_module" in line for line in failures)


def test_ansible_playbook_is_found_without_the_venv_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # as when .venv/bin/kvtier is run directly
    inventory = make_project(
        tmp_path,
        """\
        - name: Nothing
          ansible.builtin.debug:
            msg: hello
        """,
    )
    assert run_playbook(tmp_path, "site.yml", inventory, out=lambda _: None)[:2] == (True, 0)


def test_the_lab_runs_mitogens_strategy_unless_told_not_to(monkeypatch):
    monkeypatch.delenv("KVTIER_LAB_MITOGEN", raising=False)
    env = strategy_env()
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert (pathlib.Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    monkeypatch.setenv("KVTIER_LAB_MITOGEN", "0")
    assert strategy_env() == {}


def test_the_strategy_environment_prints_as_shell_exports(monkeypatch):
    monkeypatch.delenv("KVTIER_LAB_MITOGEN", raising=False)
    printed = subprocess.run(
        [sys.executable, "-m", "kvtier.lab.strategy"], check=True, capture_output=True, text=True
    ).stdout
    shell = subprocess.run(
        ["bash", "-c", printed + 'echo "$ANSIBLE_STRATEGY $ANSIBLE_TIMEOUT"'],
        check=True,
        capture_output=True,
        text=True,
    )
    assert shell.stdout.split() == ["mitogen_linear", "120"]
    monkeypatch.setenv("KVTIER_LAB_MITOGEN", "0")
    assert subprocess.run([sys.executable, "-m", "kvtier.lab.strategy"], capture_output=True, text=True).stdout == ""


def test_a_report_shows_its_lines_also_when_it_loops(tmp_path):
    inventory = make_project(
        tmp_path,
        """\
        - name: Report one
          ansible.builtin.debug:
            msg: [first line, second line]
        - name: Report each
          ansible.builtin.debug:
            msg: "{{ item }} hit in full"
          loop: [spark01, spark02]
        """,
    )
    lines = []
    assert run_playbook(tmp_path, "site.yml", inventory, out=lines.append)[0]
    shown = [line.strip() for line in lines]
    assert ["first line", "second line", "spark01 hit in full", "spark02 hit in full"] == [
        line for line in shown if line.endswith(("line", "in full"))
    ]
    assert "All items completed" not in shown


LAB_SETTINGS = ("ANSIBLE_STRATEGY", "ANSIBLE_STRATEGY_PLUGINS", "ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_TIMEOUT")


def test_an_operator_run_gets_no_lab_setting(tmp_path, monkeypatch):
    for name in (*LAB_SETTINGS, "ANSIBLE_CONFIG", "KVTIER_LAB_MITOGEN"):
        monkeypatch.delenv(name, raising=False)
    assert strategy_env(), "Mitogen is installed here: the lab would ask for it"
    inventory = make_project(
        tmp_path,
        """\
        - name: Report the strategy and configuration
          ansible.builtin.debug:
            msg: "{{ lookup('env', 'ANSIBLE_STRATEGY') or 'none' }} {{ lookup('env', 'ANSIBLE_CONFIG') }}"
        """,
    )
    lines = []
    assert run_playbook(tmp_path, "site.yml", inventory, out=lines.append)[0]
    assert f"none {tmp_path / 'ansible.cfg'}" in [line.strip() for line in lines]
    # The operator's own configuration is the one used.
    mine = tmp_path / "mine.cfg"
    mine.write_text("[defaults]\nstdout_callback = default\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(mine))
    lines.clear()
    assert run_playbook(tmp_path, "site.yml", inventory, out=lines.append)[0]
    assert f"none {mine}" in [line.strip() for line in lines]
    # The lab asks for its strategy explicitly.
    lines.clear()
    assert run_playbook(tmp_path, "site.yml", inventory, out=lines.append, env={"ANSIBLE_STRATEGY": "linear"})[0]
    assert f"linear {mine}" in [line.strip() for line in lines]


def test_kvtier_bench_storage_passes_no_lab_setting(tmp_path, monkeypatch):
    from kvtier.bench import cli as bench_cli

    seen = {}

    def fake_run(**kwargs):
        seen.update(kwargs["envvars"])
        raise SystemExit(0)

    monkeypatch.setattr("kvtier.runner.ansible_runner.run", fake_run)
    inventory = make_project(tmp_path, "[]")
    try:
        bench_cli.run_storage(str(inventory), tmp_path / "out", "1M", 1, out=lambda _: None)
    except SystemExit:
        pass
    assert seen and not set(LAB_SETTINGS) & set(seen)
