"""Checks of the data (RoCE) network: addresses valid, inside the data network, unique; one MTU.

Every host's view is a dict of its variables with the roles' defaults filled in. The data network is
`preflight_data_cidr` when set, otherwise the network of the storage node's `roce_address`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

_NETDEV = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


def _ip(value):
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def _interface(value):
    """The interface of a host/prefix string, or None when it is not one (a bare address, a network)."""
    text = str(value)
    if "/" not in text:
        return None
    try:
        iface = ipaddress.ip_interface(text)
    except ValueError:
        return None
    if iface.network.prefixlen < iface.network.max_prefixlen and iface.ip == iface.network.network_address:
        return None
    return iface


def data_network(hosts: Mapping, storage: str | None, data_cidr: str = ""):
    """(network, where it came from) or (None, problem or None)."""
    if data_cidr:
        try:
            return ipaddress.ip_network(str(data_cidr), strict=True), "preflight_data_cidr"
        except ValueError:
            return None, (
                f"preflight_data_cidr {data_cidr!r} is not a network in CIDR form: give the data network, "
                f"e.g. 10.10.0.0/24"
            )
    iface = _interface(hosts.get(storage, {}).get("roce_address") or "") if storage else None
    if iface is None:
        return None, None
    return iface.network, f"roce_address of {storage}"


def addresses(hosts: Mapping, storage: str | None, data_cidr: str = "") -> list:
    """kvtier_data_address, roce_address, roce_interface and nfs_client_server of every host."""
    problems = []
    network, source = data_network(hosts, storage, data_cidr)
    if network is None and source:
        problems.append(source)
    users: dict = {}  # address -> [(host, variable)]

    def inside(host, var, ip, shown):
        if network is not None and ip.version == network.version and ip in network:
            return
        if network is not None:
            problems.append(
                f"host {host}: {var} {shown} is outside the data network {network} ({source}): "
                f"use an address on the RoCE network"
            )

    for host, hv in hosts.items():
        data = hv.get("kvtier_data_address")
        data_ip = None
        if data in (None, ""):
            problems.append(
                f"host {host}: kvtier_data_address is not set: give the host's address on the RoCE "
                f"data network (a bare IP, e.g. 10.10.0.21)"
            )
        else:
            data_ip = _ip(data)
            if data_ip is None:
                problems.append(
                    f"host {host}: kvtier_data_address {data!r} is not an IP address: give the host's "
                    f"address on the RoCE data network (a bare IP, e.g. 10.10.0.21)"
                )
            else:
                inside(host, "kvtier_data_address", data_ip, data_ip)
                users.setdefault(data_ip, []).append((host, "kvtier_data_address"))
        roce = hv.get("roce_address") or ""
        if roce:
            iface = _interface(roce)
            if iface is None:
                problems.append(
                    f"host {host}: roce_address {roce!r} is not a host address with a prefix length: "
                    f"write it like 10.10.0.21/24"
                )
            else:
                inside(host, "roce_address", iface.ip, roce)
                if network is not None and iface.network != network and iface.ip in network:
                    problems.append(
                        f"host {host}: roce_address {roce} has prefix /{iface.network.prefixlen}, but the "
                        f"data network is {network} ({source}): use /{network.prefixlen} on every node"
                    )
                if data_ip is not None and data_ip != iface.ip:
                    problems.append(
                        f"host {host}: kvtier_data_address {data_ip} is not the address of roce_address "
                        f"{roce}: the data address must be the one on the RoCE interface"
                    )
                elif data_ip is None:
                    users.setdefault(iface.ip, []).append((host, "roce_address"))
            interface = hv.get("roce_interface") or ""
            if not interface:
                problems.append(
                    f"host {host}: roce_address is set but roce_interface is not: name the RoCE NIC's "
                    f"netdev (e.g. enp1s0f0np0)"
                )
            elif not _NETDEV.match(str(interface)):
                problems.append(
                    f"host {host}: roce_interface {interface!r} is not a netdev name (letters, digits, "
                    f"'_', '.', '-', at most 15 characters)"
                )
    for ip, used in users.items():
        if len(used) > 1:
            who = ", ".join(f"{host} ({var})" for host, var in used)
            problems.append(f"address {ip} is used by more than one host: {who}: give each node its own address")
    problems.extend(_nfs_server(hosts, storage))
    return problems


def _nfs_server(hosts: Mapping, storage: str | None) -> list:
    """A Spark's nfs_client_server must be the storage node's data address (else the mount is not over RDMA)."""
    storage_ip = _ip(hosts.get(storage, {}).get("kvtier_data_address") or "") if storage else None
    problems = []
    for host, hv in hosts.items():
        server = hv.get("nfs_client_server") or ""
        if not server or storage_ip is None or host == storage:
            continue
        server_ip = _ip(server)
        if server_ip is not None and server_ip != storage_ip:
            problems.append(
                f"host {host}: nfs_client_server {server} is not the storage node's data address "
                f"({storage} kvtier_data_address {storage_ip}): mount over the RoCE network"
            )
    return problems


def mtu(hosts: Mapping) -> list:
    """Every host with a RoCE interface must use the same roce_mtu, as an integer."""
    problems, by_value = [], {}
    for host, hv in hosts.items():
        if not (hv.get("roce_address") or hv.get("roce_interface")):
            continue
        value = hv.get("roce_mtu")
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"host {host}: roce_mtu {value!r} is not an integer: write it unquoted, e.g. 9000")
            continue
        by_value.setdefault(value, []).append(host)
    if len(by_value) > 1:
        spread = "; ".join(f"{value} on {', '.join(names)}" for value, names in sorted(by_value.items()))
        problems.append(
            f"roce_mtu differs between nodes ({spread}): the RDMA path MTU follows the smallest and "
            f"mismatched MTUs drop large frames; set one roce_mtu for all nodes (group_vars/all)"
        )
    return problems
