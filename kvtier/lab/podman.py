"""Podman hosts of the lab: systemd containers on their own network, standing in for cluster nodes."""

from __future__ import annotations

import json
import subprocess
import time

NETWORK = "kvtier-lab"
LABEL = "org.kvtier.lab=1"


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def ensure_network() -> None:
    if _podman("network", "exists", NETWORK, check=False).returncode != 0:
        _podman("network", "create", "--label", LABEL, NETWORK)


def ensure_container(name: str, image: str) -> None:
    """Start a systemd container unless it already runs."""
    state = _podman("container", "inspect", "--format", "{{.State.Running}}", name, check=False)
    if state.returncode == 0 and state.stdout.strip() == "true":
        return
    if state.returncode == 0:
        _podman("start", name)
    else:
        _podman("run", "--detach", "--name", name, "--hostname", name, "--label", LABEL,
                "--network", NETWORK, "--systemd", "always", image, "/sbin/init")
    wait_for_systemd(name)


def wait_for_systemd(name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = _podman("exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: systemd did not finish booting (state {state!r})")
        time.sleep(1)


def address(name: str) -> str:
    info = json.loads(_podman("container", "inspect", name).stdout)[0]
    return info["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]


def lab_containers() -> list[dict]:
    out = _podman("ps", "--all", "--filter", f"label={LABEL}", "--format", "json").stdout
    return json.loads(out or "[]")


def remove_all() -> list[str]:
    """Remove every container and the network the lab created; return what was removed."""
    removed = []
    for container in lab_containers():
        name = container["Names"][0]
        _podman("rm", "--force", "--time", "5", name)
        removed.append(f"container {name}")
    if _podman("network", "exists", NETWORK, check=False).returncode == 0:
        _podman("network", "rm", NETWORK)
        removed.append(f"network {NETWORK}")
    return removed
