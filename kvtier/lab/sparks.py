"""The lab's Sparks: systemd containers on the lab network, sharing one volume as their L3 directory.

A container cannot mount NFS here (no RDMA, no privileges for it), so the L3 tier of the lab Sparks is a
podman volume mounted at the same path in each: the same `fs` adapter and files, but not the NVMe pool.
Ansible and the tier proof reach them over SSH at their lab address, as they reach real Sparks: as an
unprivileged login user with sudo (`LOGIN_USER`, the lab's key); root's key is the lab's own hand (faults).
"""

from __future__ import annotations

import json
import subprocess
import time

from kvtier import images
from kvtier.lab import fabric
from kvtier.vm.host import SSH_OPTS
from kvtier.vm.image import LOGIN_USER

IMAGE = images.RECIPES["spark"].name
VOLUME = "kvtier-lab-l3"
L3_MOUNT = "/srv/kvtier-l3"
# vLLM needs more than podman's default 64 MiB of /dev/shm (160 MiB measured).
SHM_SIZE = "1g"


def container(host: str) -> str:
    return f"kvtier-lab-{host}"


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return fabric.run(["podman", *args], check=check)


def state(host: str) -> str | None:
    """'running', 'exited', ..., 'stale' or None when there is no such container.

    'stale': podman still records the container as running but its processes are gone (the host rebooted,
    or conmon was killed); anything run in it fails, so it is not running for the lab.
    """
    proc = _podman("container", "inspect", container(host), check=False)
    if proc.returncode != 0:
        return None
    status = json.loads(proc.stdout)[0]["State"]["Status"]
    if status == "running" and _podman("exec", container(host), "true", check=False).returncode != 0:
        return "stale"
    return status


def containers_volume(host: str) -> str:
    return f"kvtier-lab-{host}-containers"


def start(host: str, address: str, public_key: str, nested: bool = False) -> bool:
    """Run the container for `host` at `address`, with `public_key` (a file) as root's authorized key;
    False when it was already running. `nested`: the Spark runs its services in containers of its own podman
    (privileged, its image store on a volume: overlay cannot stack on the container's own overlay)."""
    current = state(host)
    if current == "running":
        return False
    if current is not None:  # exited or stale: start over, its systemd and services would not come back
        _podman("rm", "--force", "--time", "10", container(host))
    _podman(
        "run",
        "--detach",
        "--name",
        container(host),
        "--hostname",
        host,
        "--label",
        fabric.LABEL,
        "--network",
        fabric.NETWORK,
        "--ip",
        address,
        "--shm-size",
        SHM_SIZE,
        "--systemd",
        "always",
        "--volume",
        f"{VOLUME}:{L3_MOUNT}:rw",
        "--volume",
        f"{public_key}:/root/.ssh/authorized_keys:ro",
        # The firewall role loads an nftables table in the Spark's own network namespace.
        *(["--privileged", "--volume", f"{containers_volume(host)}:/var/lib/containers:rw"] if nested else []),
        *([] if nested else ["--cap-add", "NET_ADMIN"]),
        IMAGE,
        "/sbin/init",
    )
    add_login_user(host)
    return True


# Creates the login user with root's key (mounted read-only) and password-less sudo, as an operator's account.
_LOGIN_USER_SCRIPT = f"""set -eu
id {LOGIN_USER} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {LOGIN_USER}
install -d -m 700 -o {LOGIN_USER} -g {LOGIN_USER} /home/{LOGIN_USER}/.ssh
install -m 600 -o {LOGIN_USER} -g {LOGIN_USER} /root/.ssh/authorized_keys /home/{LOGIN_USER}/.ssh/authorized_keys
printf '%s ALL=(ALL) NOPASSWD: ALL\\n' {LOGIN_USER} > /etc/sudoers.d/{LOGIN_USER}
chmod 440 /etc/sudoers.d/{LOGIN_USER}
"""


def add_login_user(host: str, name: str | None = None) -> None:
    """The host's login user (`LOGIN_USER`): what Ansible and the CLI log in as (`name`: its container's, when it is
    not a Spark's)."""
    _podman("exec", name or container(host), "sh", "-c", _LOGIN_USER_SCRIPT)


def ssh_args(address: str, key: str) -> list:
    return ["ssh", "-i", key, *SSH_OPTS, f"{LOGIN_USER}@{address}"]


def wait_ssh(host: str, address: str, key: str, timeout: float = 180) -> float:
    """Seconds until the container's sshd lets the login user in and sudo works; FabricError after `timeout`."""
    started = time.monotonic()
    while True:
        proc = subprocess.run([*ssh_args(address, key), "sudo -n true"], capture_output=True, text=True)
        if proc.returncode == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise fabric.FabricError(f"{host}: no SSH at {address} after {timeout:.0f} s: {proc.stderr.strip()}")
        time.sleep(1)


def lab_containers() -> list[str]:
    out = _podman("ps", "--all", "--filter", f"label={fabric.LABEL}", "--format", "{{.Names}}").stdout
    return out.split()


def remove() -> list[str]:
    """Remove every lab container and the L3 volume; returns what was removed."""
    names = lab_containers()
    left = names
    # One podman call for all of them: podman stops them in parallel (each may take its whole --time).
    for _attempt in range(6):
        if not left:
            break
        proc = _podman("rm", "--force", "--time", "10", *left, check=False)
        # A container whose vLLM is still freeing gigabytes can outlast podman's wait after SIGKILL: retry.
        left = [name for name in left if _podman("container", "exists", name, check=False).returncode == 0]
        if left:
            time.sleep(5)
    if left:
        raise fabric.FabricError(f"podman rm {' '.join(left)}: {proc.stderr.strip()}")
    removed = [f"container {name}" for name in names]
    for volume in nested_volumes():
        _podman("volume", "rm", "--force", volume, check=False)
        removed.append(f"volume {volume}")
    if volume_exists():
        proc = _podman("volume", "rm", "--force", VOLUME, check=False)
        # After a host reboot podman can fail to free the volume's lock and still remove it: judge by the result.
        if volume_exists():
            raise fabric.FabricError(f"podman volume rm {VOLUME}: {proc.stderr.strip()}")
        removed.append(f"volume {VOLUME}")
    return removed


def nested_volumes() -> list[str]:
    """The image stores of the Sparks that run their services in containers."""
    out = _podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
    return [name for name in out if name.startswith("kvtier-lab-") and name.endswith("-containers")]


def volume_exists() -> bool:
    return _podman("volume", "exists", VOLUME, check=False).returncode == 0
