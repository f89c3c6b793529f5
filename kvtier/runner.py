"""Run one of kvtier's playbooks through ansible-runner, as `ansible-playbook` would, one readable line per task.

An operator's command gets the operator's Ansible: the configuration `ANSIBLE_CONFIG` names (kvtier's own
ansible.cfg otherwise) and the environment as it is. Whatever else a caller wants (the lab's Mitogen strategy,
kvtier/lab/strategy.py) it passes as `env`; nothing is added by default.
"""

from __future__ import annotations

import collections
import os
import pathlib
import shlex
import sys
import tempfile
import time

import ansible_runner

_STATUS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "FAILED",
    "runner_on_unreachable": "UNREACHABLE",
    "runner_on_skipped": None,  # skipped tasks are noise in a progress view
}


class _Progress:
    def __init__(self, out):
        self.out = out
        self.changed = 0
        self.changed_tasks: list[str] = []
        self.failures: list[str] = []

    def _hidden_changes(self, stats: dict) -> None:
        """A no_log task's event carries no result, not even `changed`; the play recap still counts it. Each such
        change is listed as one entry per host, so that no check of what a run changed can miss it."""
        seen = collections.Counter(task.split(": ", 1)[0] for task in self.changed_tasks)
        for host, total in sorted((stats.get("changed") or {}).items()):
            hidden = total - seen[host]
            if hidden > 0:
                self.changed += hidden
                self.changed_tasks.append(f"{host}: {hidden} task(s) whose results no_log hides")
                self.out(f"    {'changed':<9} {host:<18} {hidden} task(s) whose results no_log hides")

    def __call__(self, event: dict) -> bool:
        kind = event.get("event")
        data = event.get("event_data", {})
        if kind == "playbook_on_play_start":
            self.out(f"\n  play: {data.get('play', '')}")
        if kind == "playbook_on_stats":
            self._hidden_changes(data)
        status = _STATUS.get(kind)
        if status:
            result = data.get("res", {})
            if status == "ok" and result.get("changed"):
                status = "changed"
                self.changed += 1
                self.changed_tasks.append(f"{data.get('host')}: {data.get('task')}")
            if status in ("FAILED", "UNREACHABLE") and data.get("ignore_errors"):
                status = "failed (ignored)"
            self.out(f"    {status:<9} {data.get('host', ''):<18} {data.get('task', '')}")
            # Playbooks end with "Report ..." tasks whose messages are the point of the run: show them.
            if status == "ok" and data.get("task", "").startswith("Report"):
                # A looped report's own msg is "All items completed": its lines are the items' messages.
                messages = [r.get("msg") for r in result.get("results", [])] or [result.get("msg")]
                for msg in filter(None, messages):
                    for line in msg if isinstance(msg, list) else [msg]:
                        self.out(f"              {line}")
            if status in ("FAILED", "UNREACHABLE"):
                msg = result.get("msg") or result.get("stderr") or ""
                self.failures.append(f"{data.get('host')}: {data.get('task')}: {msg}")
                self.out(f"              {msg}")
        return True


def run_playbook(
    repo: pathlib.Path,
    playbook: str,
    inventory: pathlib.Path,
    *,
    out=print,
    extravars=None,
    check: bool = False,
    changes: list | None = None,
    env: dict | None = None,
    limit: str = "",
    vault_password_file: str = "",
):
    """Run repo/playbooks/<playbook>; return (ok, changed task count, seconds, failure messages).
    `changes`, when given, receives "host: task" for every task that changed something; `env` is added to the
    playbook's environment; `limit` and `vault_password_file` are ansible-playbook's --limit and
    --vault-password-file."""
    options = (["--check", "--diff"] if check else []) + (["--limit", limit] if limit else [])
    options += ["--vault-password-file", vault_password_file] if vault_password_file else []
    progress = _Progress(out)
    started = time.monotonic()
    # A private directory of this run alone: ansible-runner writes envvars and extravars there on a first run
    # and reads them back on every later one, so a shared one would hand one run's settings to the next.
    with tempfile.TemporaryDirectory(prefix="kvtier-runner-") as private:
        result = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(repo),
            playbook=str(repo / "playbooks" / playbook),
            inventory=str(inventory),
            extravars=extravars or {},
            cmdline=shlex.join(options) if options else None,
            # ansible-playbook from the venv kvtier runs in, also when that venv is not on PATH.
            envvars={
                "ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG") or str(repo / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                "PATH": os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")]),
                **(env or {}),
            },
            event_handler=progress,
            quiet=True,
        )
        failures = progress.failures
        if result.rc != 0 and not failures:  # it stopped before any task: a syntax error, a missing command
            lines = [line for line in result.stdout.read().splitlines() if line.strip()]
            failures = (
                [line for line in lines if line.startswith(("[ERROR]", "ERROR!", "Origin:"))]
                or lines[-5:]
                or [f"ansible-playbook exited with {result.rc} ({result.status})"]
            )
    if changes is not None:
        changes.extend(progress.changed_tasks)
    return result.rc == 0, progress.changed, time.monotonic() - started, failures
