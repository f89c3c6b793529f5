"""An operator's machine, ops01: a fresh Debian host on the lab network (systemd, SSH, none of the lab's packages),
where a user who is not root installs kvtier from the checkout as the README says, then runs `kvtier plan`,
`kvtier health` and `kvtier prove` against the lab with a copy of its inventory and key.

It is also the lab's operations host, in the inventory's group kvtier_monitoring: site.yml installs Prometheus there,
and the operator's stage installs the health timer with the operator's kvtier, as an operator would
(playbooks/health_timer.yml). The host starts with the lab's other hosts; the install runs beside the lab's first
stages (pip reads wheels this host already has, so it needs no index); the stage then waits for it.
"""

from __future__ import annotations

import pathlib
import shlex
import shutil
import subprocess
import sys
import time

import yaml

from kvtier import images
from kvtier.lab import fabric, sparks
from kvtier.lab.inventory import INVENTORY, OPS_ADDRESS, OPS_HOST, REPO, STATE
from kvtier.lab.stages import StageFailed

HOST, ADDRESS = OPS_HOST, OPS_ADDRESS
CONTAINER = "kvtier-lab-ops01"
IMAGE = images.RECIPES["ops"].name
USER = "ops"  # an operator account (Debian already has a group named operator)
HOME = f"/home/{USER}"
WHEELS = STATE / "operator-wheels"
# What the fresh machine gets from Debian before the README's install: Python's venv and an SSH client.
PACKAGES = ("python3-venv", "openssh-client")
# The README's install, with pip reading the wheels this host has instead of an index.
INSTALL = "python3 -m venv ~/kvtier && PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels ~/kvtier/bin/pip install --quiet ./kvtier"
DONE = f"{HOME}/install.rc"


def _podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise StageFailed(f"podman {args[0]} {args[1] if len(args) > 1 else ''}: {proc.stderr.strip()[-800:]}")
    return proc


def _exec(command: str, user: str = "root", timeout: float = 600, check: bool = True):
    return _podman(
        "exec",
        "--user",
        user,
        "--workdir",
        HOME if user == USER else "/",
        CONTAINER,
        "bash",
        "-lc",
        command,
        check=check,
        timeout=timeout,
    )


def as_root(command: str, timeout: float = 120) -> str:
    """What `command` prints, run as root on ops01."""
    return _exec(command, timeout=timeout).stdout


def _source_files() -> list[str]:
    """The checkout as a clone has it: tracked files and new ones git does not ignore."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return [name for name in listed if name and (REPO / name).exists()]


def start_host(public_key: str) -> bool:
    """ops01 on the lab network with systemd and the lab's login user (as every lab host); False when it runs."""
    if _podman("container", "exists", CONTAINER, check=False).returncode == 0:
        if _podman("exec", CONTAINER, "true", check=False).returncode == 0:
            return False
        _podman("rm", "--force", "--time", "10", CONTAINER)
    _podman(
        "run",
        "--detach",
        "--name",
        CONTAINER,
        "--hostname",
        HOST,
        "--label",
        fabric.LABEL,
        "--network",
        fabric.NETWORK,
        "--ip",
        ADDRESS,
        "--systemd",
        "always",
        # The firewall role loads an nftables table in its own network namespace; the health timer's unit runs in a
        # mount namespace of its own (PrivateTmp, ProtectSystem), as on a real host.
        "--cap-add",
        "NET_ADMIN",
        "--cap-add",
        "SYS_ADMIN",
        "--volume",
        f"{public_key}:/root/.ssh/authorized_keys:ro",
        IMAGE,
        "/sbin/init",
    )
    sparks.add_login_user(HOST, CONTAINER)
    return True


def start(out) -> None:
    """The operator's user, the checkout and the wheels; the install then runs on ops01 in the background."""
    if _exec(f"id {USER}", check=False).returncode == 0:
        return
    shutil.rmtree(WHEELS, ignore_errors=True)  # only the lock's wheels: pip would take a newer one left over
    WHEELS.mkdir(parents=True)
    download = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "-r",
            str(REPO / "requirements.lock"),
            "-d",
            str(WHEELS),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if download.returncode != 0:
        raise StageFailed(f"the wheels for the operator's install: {download.stderr.strip()[-800:]}")
    _exec("mkdir -p /wheels")
    subprocess.run(["podman", "cp", f"{WHEELS}/.", f"{CONTAINER}:/wheels"], capture_output=True, text=True, check=True)
    _exec(f"useradd --create-home --shell /bin/bash {USER} && mkdir {HOME}/kvtier")
    archive = subprocess.run(
        ["tar", "-C", str(REPO), "-cf", "-", "--null", "-T", "-"],
        input="\0".join(_source_files()).encode(),
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(
        ["podman", "exec", "-i", CONTAINER, "tar", "-C", f"{HOME}/kvtier", "-xf", "-"],
        input=archive,
        capture_output=True,
        check=True,
    )
    _exec(f"chown -R {USER}: {HOME}/kvtier")
    # apt as an operator's fresh machine has it, then the install as the operator, both in the background.
    script = (
        f"(DEBIAN_FRONTEND=noninteractive apt-get -qq update && "
        f"DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends {' '.join(PACKAGES)} "
        f"&& su - {USER} -c {shlex.quote(INSTALL)}) > {HOME}/install.log 2>&1; echo $? > {DONE}"
    )
    _podman("exec", "--detach", CONTAINER, "bash", "-c", script)
    out(f"  {CONTAINER}: installing kvtier as {USER} (apt, then pip from {len(list(WHEELS.glob('*.whl')))} wheels)")


def _wait_install(timeout: float = 900) -> float:
    started = time.monotonic()
    while True:
        done = _exec(f"cat {DONE} 2>/dev/null", check=False).stdout.strip()
        if done:
            if done != "0":
                log = _exec(f"tail -n 20 {HOME}/install.log", check=False).stdout
                raise StageFailed(f"the operator's install failed (exit {done}): {log.strip()[-1500:]}")
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise StageFailed(f"the operator's install did not end within {timeout:.0f} s")
        time.sleep(2)


def as_operator(inventory: dict, key: str) -> tuple:
    """The inventory with every host's key at `key` (where the operator keeps it), and the one key it named. A host
    the lab reaches through a forwarded port on its own loopback (the storage VM) is reached at its data address."""
    named = set()
    for group in inventory["all"]["children"].values():
        for hostvars in group["hosts"].values():
            named.add(hostvars["ansible_ssh_private_key_file"])
            hostvars["ansible_ssh_private_key_file"] = key
            if hostvars.get("ansible_host") == "127.0.0.1":
                hostvars["ansible_host"] = hostvars["kvtier_data_address"]
                hostvars["ansible_port"] = 22
    if len(named) != 1:
        raise StageFailed(f"the lab inventory names {len(named)} keys; one was expected")
    return inventory, named.pop()


def _copy_inventory() -> str:
    """The lab's inventory (hosts.yml, group_vars/) and key as an operator keeps them: in their home, the key only
    theirs."""
    inventory, key = as_operator(yaml.safe_load(INVENTORY.read_text()), f"{HOME}/.ssh/lab_key")
    root = INVENTORY.parent
    files = {
        f"{HOME}/.ssh/lab_key": pathlib.Path(key).read_bytes(),
        f"{HOME}/lab/hosts.yml": yaml.safe_dump(inventory).encode(),
    }
    for folder in ("group_vars", "host_vars"):
        files.update(
            {
                f"{HOME}/lab/{p.relative_to(root)}": p.read_bytes()
                for p in sorted((root / folder).rglob("*"))
                if p.is_file()
            }
        )
    for path, data in files.items():
        quoted = shlex.quote(path)
        subprocess.run(
            [
                "podman",
                "exec",
                "-i",
                "--user",
                USER,
                CONTAINER,
                "bash",
                "-c",
                f"umask 077 && mkdir -p $(dirname {quoted}) && cat > {quoted}",
            ],
            input=data,
            check=True,
            capture_output=True,
        )
    return f"{HOME}/lab/hosts.yml"


def run(out) -> str:
    """Wait for the install, then plan, health and prove as the operator; each must exit 0."""
    start(out)
    waited = _wait_install()
    lab_only = _exec("command -v podman qemu-system-x86_64 mmdebstrap || true", check=False).stdout.split()
    uid = _exec("id -u", user=USER).stdout.strip()
    if lab_only or uid == "0":
        raise StageFailed(f"not an operator's machine: lab packages {lab_only}, uid {uid}")
    inventory = _copy_inventory()
    said = []
    for command in ("kvtier plan --model Qwen3-8B", f"kvtier health -i {inventory}", f"kvtier prove -i {inventory}"):
        started = time.monotonic()
        proc = _exec(f"~/kvtier/bin/{command}", user=USER, check=False)
        for line in (proc.stdout + proc.stderr).strip().splitlines()[-6:]:
            out(f"  {USER}$ {line}")
        if proc.returncode != 0:
            raise StageFailed(f"`{command}` as {USER} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        said.append(f"{command.split()[1]} {time.monotonic() - started:.0f} s")
    return f"installed as uid {uid} without the lab's packages (waited {waited:.0f} s); " + ", ".join(said)
