"""Run a playbook through ansible-runner and print one readable line per task result.

The lab runs its playbooks with Mitogen's linear strategy (the `mitogen` package, in requirements.lock): the same
plays, tasks and modules, but each host keeps one Python interpreter for the whole run instead of starting one
per task. On the lab's storage node, a QEMU/TCG guest, starting Python and compiling Ansible's module code takes
8-9 s per task (a no-op `ping`: 9.0 s, measured); with Mitogen a simple task takes under a second there.
KVTIER_LAB_MITOGEN=0 runs stock Ansible's strategy, as real clusters get by default; the role scenarios (molecule)
always run stock Ansible.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import ansible_runner

_STATUS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "FAILED",
    "runner_on_unreachable": "UNREACHABLE",
    "runner_on_skipped": None,  # skipped tasks are noise in a progress view
}


def strategy_env() -> dict:
    """The environment that selects Mitogen's strategy for a lab run ({} where it is off or not installed)."""
    if os.environ.get("KVTIER_LAB_MITOGEN", "1") == "0":
        return {}
    try:
        import ansible_mitogen
    except ImportError:
        return {}
    return {
        "ANSIBLE_STRATEGY_PLUGINS": str(pathlib.Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"),
        "ANSIBLE_STRATEGY": "mitogen_linear",
        # Every lab host is new (its inventory already tells ssh not to pin host keys); Mitogen decides host-key
        # checking from this setting rather than from the inventory's ssh arguments.
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        # Mitogen starts its interpreter within the connection timeout: in a TCG guest on a busy host that took
        # over 10 s (Ansible's default), and the run failed with "Connection timed out".
        "ANSIBLE_TIMEOUT": "120",
    }


class _Progress:
    def __init__(self, out):
        self.out = out
        self.changed = 0
        self.changed_tasks: list[str] = []
        self.failures: list[str] = []

    def __call__(self, event: dict) -> bool:
        kind = event.get("event")
        data = event.get("event_data", {})
        if kind == "playbook_on_play_start":
            self.out(f"\n  play: {data.get('play', '')}")
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
            if status == "ok" and data.get("task", "").startswith("Report") and result.get("msg"):
                lines = result["msg"] if isinstance(result["msg"], list) else [result["msg"]]
                for line in lines:
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
):
    """Run repo/playbooks/<playbook>; return (ok, changed task count, seconds, failure messages).
    `changes`, when given, receives "host: task" for every task that changed something."""
    progress = _Progress(out)
    started = time.monotonic()
    private = repo / ".cache" / "runner"
    private.mkdir(parents=True, exist_ok=True)
    # ansible-runner keeps the command line in env/cmdline and reuses it when none is given: without this,
    # a `lab up --check` would turn every later run into a check.
    (private / "env" / "cmdline").unlink(missing_ok=True)
    result = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(repo),
        playbook=str(repo / "playbooks" / playbook),
        inventory=str(inventory),
        extravars=extravars or {},
        cmdline="--check --diff" if check else None,
        # ansible-playbook from the venv kvtier runs in, also when that venv is not on PATH.
        envvars={
            "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")]),
            **strategy_env(),
        },
        event_handler=progress,
        quiet=True,
    )
    failures = progress.failures
    if changes is not None:
        changes.extend(progress.changed_tasks)
    if result.rc != 0 and not failures:  # it stopped before any task: a syntax error, a missing command
        lines = [line for line in result.stdout.read().splitlines() if line.strip()]
        failures = (
            [line for line in lines if line.startswith(("[ERROR]", "ERROR!", "Origin:"))]
            or lines[-5:]
            or [f"ansible-playbook exited with {result.rc} ({result.status})"]
        )
    return result.rc == 0, progress.changed, time.monotonic() - started, failures
