"""The lab's data network: one podman bridge for the Spark containers, with a tap on it for the storage VM.

On a real cluster the data network is the 100GbE RoCE fabric. Here it is a Linux bridge that podman
manages (so the containers get fixed addresses) and that a tap device joins, which QEMU uses as the storage
VM's second NIC. The Sparks reach Valkey on the VM's data address directly, as they would on the fabric;
soft-RoCE and the NFS/RDMA export run inside the VM on that NIC. There is no RDMA on the containers' side.
"""

from __future__ import annotations

import json
import subprocess

NETWORK = "kvtier-lab"
SUBNET = "10.213.7.0/24"
TAP = "kvtlab0"
LABEL = "org.kvtier.lab=1"


class FabricError(Exception):
    pass


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise FabricError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def network_exists() -> bool:
    return run(["podman", "network", "exists", NETWORK], check=False).returncode == 0


def ensure_network() -> None:
    if not network_exists():
        run(["podman", "network", "create", "--subnet", SUBNET, "--label", LABEL, NETWORK])


def bridge() -> str | None:
    """The Linux bridge behind the podman network (podman names it podmanN), or None without the network."""
    if not network_exists():
        return None
    info = json.loads(run(["podman", "network", "inspect", NETWORK]).stdout)
    return info[0].get("network_interface") if info else None


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def ensure_tap() -> None:
    """Create the tap and plug it into the bridge. The bridge exists once a container has joined it."""
    br = bridge()
    if not br or not link_exists(br):
        raise FabricError(f"bridge of podman network {NETWORK} is not up: start a container on it first")
    if not link_exists(TAP):
        run(["ip", "tuntap", "add", "dev", TAP, "mode", "tap"])
    run(["ip", "link", "set", "dev", TAP, "master", br])
    run(["ip", "link", "set", "dev", TAP, "up"])


def remove() -> list[str]:
    """Remove the tap, the podman network and the bridge; returns what existed and was removed."""
    removed = []
    br = bridge()
    if link_exists(TAP):
        run(["ip", "link", "del", "dev", TAP])
        removed.append(f"tap {TAP}")
    if network_exists():
        run(["podman", "network", "rm", "-f", NETWORK])
        removed.append(f"podman network {NETWORK}")
    # netavark keeps a bridge that still had another port (the tap) when its last container left.
    if br and link_exists(br):
        run(["ip", "link", "del", "dev", br])
        removed.append(f"bridge {br}")
    return removed
