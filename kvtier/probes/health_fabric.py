"""Health of the RDMA fabric: each data interface and its RDMA link (read from sysfs and `ip` on the node)."""

from __future__ import annotations

import json
import os
import subprocess

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, UNVERIFIED, check
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, UNVERIFIED, check


def _sysfs(path):
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def fabric_state(interfaces):
    """The RoCE data interfaces as this node sees them: each netdev's operstate and MTU (sysfs) and the RDMA links
    on it (`rdma -j link show`, iproute2)."""
    state = {"rdma_error": None, "interfaces": {}}
    try:
        done = subprocess.run(["rdma", "-j", "link", "show"], capture_output=True, text=True, timeout=10, check=False)
        links = json.loads(done.stdout or "[]") if done.returncode == 0 else []
        if done.returncode != 0:
            state["rdma_error"] = (done.stderr or "").strip() or f"exit {done.returncode}"
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        links, state["rdma_error"] = [], str(exc)
    for name in interfaces or ():
        base = f"/sys/class/net/{name}"
        if not os.path.isdir(base):
            state["interfaces"][name] = {"exists": False}
            continue
        mtu = _sysfs(f"{base}/mtu")
        state["interfaces"][name] = {
            "exists": True,
            "operstate": _sysfs(f"{base}/operstate"),
            "mtu": int(mtu) if mtu and mtu.isdigit() else None,
            "rdma": [
                {"device": link.get("ifname"), "port": link.get("port"), "state": link.get("state")}
                for link in links
                if link.get("netdev") == name
            ],
        }
    return state


def fabric_checks(host, state, mtu):
    """Each RoCE data interface (from `fabric_state`): the netdev up at the fabric's MTU (roce_mtu), an RDMA link
    on it, ACTIVE. Every node is checked against the same MTU, so both ends of every path agree."""
    if not state or not state.get("interfaces"):
        return [
            check(
                host,
                "fabric",
                UNVERIFIED,
                "FABRIC_UNKNOWN",
                "the RoCE data interfaces were not read (roce_interface unset, or the node was not reached)",
                "set roce_interface for the host",
            )
        ]
    out = []
    for name, nic in sorted(state["interfaces"].items()):
        if not nic.get("exists"):
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_NETDEV_MISSING",
                    f"{name} does not exist",
                    "check roce_interface (roce_extra_interfaces) and the NIC driver: `ip link`",
                )
            )
            continue
        found = len(out)
        if nic.get("operstate") in ("down", "lowerlayerdown", "notpresent"):
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_LINK_DOWN",
                    f"{name} is {nic.get('operstate')}: no traffic passes",
                    "check the cable and the switch port; re-run the roce role",
                )
            )
        if mtu and nic.get("mtu") != mtu:
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_MTU",
                    f"{name} has MTU {nic.get('mtu')}, the fabric's is {mtu} (roce_mtu): RDMA's path MTU follows the "
                    "netdev's, and a hop with a smaller MTU drops the larger frames",
                    "re-run the roce role; every host and switch port must carry roce_mtu",
                )
            )
        active = [link for link in nic.get("rdma") or [] if link.get("state") == "ACTIVE"]
        if not nic.get("rdma"):
            unread = f" (rdma link show: {state['rdma_error']})" if state.get("rdma_error") else ""
            out.append(
                check(
                    host,
                    "fabric",
                    UNVERIFIED if state.get("rdma_error") else ERR,
                    "FABRIC_NO_RDMA",
                    f"no RDMA device on {name}{unread}: NFS and P2P cannot use RDMA",
                    "load the NIC's RDMA driver (mlx5_ib) or soft-RoCE (roce_soft_roce); install iproute2 for `rdma`",
                )
            )
        elif not active:
            states = ", ".join(f"{link.get('device')}/{link.get('port')} {link.get('state')}" for link in nic["rdma"])
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_RDMA_DOWN",
                    f"the RDMA link on {name} is not ACTIVE ({states})",
                    "check the link (`rdma link show`, `ibv_devinfo`) and the switch port",
                )
            )
        if len(out) == found:
            links = ", ".join(f"{link.get('device')}/{link.get('port')}" for link in active)
            out.append(check(host, "fabric", OK, "FABRIC_OK", f"{links} ACTIVE on {name}, MTU {nic.get('mtu')}"))
    return out
