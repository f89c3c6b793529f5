"""The lab after a host reboot: podman still records the Spark containers as running, but nothing runs in them."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from kvtier.lab import fabric, hosts, sparks

needs_podman = pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman and the kvtier base image")


def _podman(*argv):
    return subprocess.run(["podman", *argv], capture_output=True, text=True)


@needs_podman
def test_a_container_whose_processes_died_is_stale_not_running():
    host = "unit-stale"
    name = sparks.container(host)
    _podman("rm", "--force", "--time", "0", name)
    try:
        started = _podman("run", "--detach", "--name", name, sparks.IMAGE, "sleep", "600")
        assert started.returncode == 0, started.stderr
        assert sparks.state(host) == "running"

        # What a reboot leaves behind: conmon and the container's process gone, podman's record unchanged.
        record = json.loads(_podman("container", "inspect", name).stdout)[0]["State"]
        for pid in (record["ConmonPid"], record["Pid"]):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{record['Pid']}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(_podman("container", "inspect", name).stdout)[0]["State"]["Status"] == "running"

        assert sparks.state(host) == "stale"
    finally:
        _podman("rm", "--force", "--time", "0", name)
    assert sparks.state(host) is None


def test_down_runs_every_step_and_reports_what_failed(monkeypatch):
    calls = []

    def step(name, result):
        return lambda: calls.append(name) or result

    def broken():
        calls.append("sparks")
        raise fabric.FabricError("podman volume rm kvtier-lab-l3: device busy")

    monkeypatch.setattr(hosts, "_destroy_vm", step("vm", ["VM kvtier-storage"]))
    monkeypatch.setattr(sparks, "remove", broken)
    monkeypatch.setattr(fabric, "remove", step("fabric", ["tap kvtlab0"]))
    monkeypatch.setattr(hosts, "_forget_inventory", step("inventory", []))
    monkeypatch.setattr(hosts, "leftovers", lambda: ["podman volume kvtier-lab-l3"])
    lines = []

    assert hosts.down(out=lines.append) == 1
    assert calls == ["vm", "sparks", "fabric", "inventory"]
    assert lines == [
        "removed VM kvtier-storage, tap kvtlab0",
        "failed: podman volume rm kvtier-lab-l3: device busy",
        "still there: podman volume kvtier-lab-l3",
    ]
