"""One ansible-playbook run from the repository root, its outcome read from Ansible's JSON callback."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_json(tmp_path, *args) -> tuple:
    """(return code, the JSON callback's report) of `ansible-playbook ARGS` with the repository's ansible.cfg."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.json",  # not profile_tasks: stdout stays JSON
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="false",
    )
    command = [str(pathlib.Path(sys.executable).parent / "ansible-playbook"), *map(str, args)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


def results(report):
    """Every host result of every task, in order."""
    for play in report["plays"]:
        for task in play["tasks"]:
            yield from task["hosts"].values()


def check_units(tmp_path, *args) -> tuple:
    """(return code, {unit file name: text it would write}, failure messages) of `ansible-playbook ARGS --check
    --diff`: the systemd units a role would write, read from the diffs of its tasks."""
    rc, report = run_json(tmp_path, *args, "--check", "--diff")
    written, failed = {}, []
    for result in results(report):
        if result.get("failed"):
            failed.append(str(result.get("msg")))
        for item in result.get("results", [result]):
            dest = str(item.get("invocation", {}).get("module_args", {}).get("dest", ""))
            if dest.startswith("/etc/systemd/system/") and item.get("diff"):
                written[pathlib.Path(dest).name] = item["diff"][0]["after"]
    return rc, written, failed
