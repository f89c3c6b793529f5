"""Who may reach each of a node's kvtier ports, computed from the cluster spec: the rules the `firewall` role loads.

Every data-plane port is open to the cluster's own data addresses only (addresses, not the subnet: a controller or
another host may share it); vLLM's API to the router, the operator's addresses and the monitoring hosts; every
exporter to the monitoring hosts only, their Prometheus to the operator; the router's client port to the client
networks, its statistics page to the operator. Ports kvtier does not own are left alone. On a Spark, output
rules by owner keep every local user but root and the service user off LMCache's port and the L2 server: a local
user carries the Spark's own address, which the input rules admit.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from kvtier.cluster.spec import ClusterSpec

ANYWHERE = ("0.0.0.0/0", "::/0")
NFS_PORT, RPCBIND_PORT, ROCEV2_PORT = 2049, 111, 4791


@dataclass(frozen=True)
class Rule:
    what: str
    proto: str  # tcp or udp
    port: int | str  # a port, or a range "first-last"
    peers: tuple  # addresses or networks allowed (input: sources; output: destinations)
    owners: tuple = ()  # output rules: the uids allowed to connect

    def family(self, version: int) -> tuple:
        return tuple(p for p in self.peers if ipaddress.ip_network(p, strict=False).version == version)


@dataclass(frozen=True)
class Router:
    host: str
    address: str
    port: int
    stats_port: int


@dataclass(frozen=True)
class Storage:
    host: str
    address: str


@dataclass
class HostRules:
    input: list = field(default_factory=list)
    output: list = field(default_factory=list)


def _open_to_all(networks) -> bool:
    return not networks or any(str(n) in ANYWHERE for n in networks)


def rules(
    spec: ClusterSpec,
    host: str,
    storage: Storage | None,
    router: Router | None,
    admin: tuple = (),
    clients: tuple = ANYWHERE,
    service_uid: int | None = None,
    scrapers: tuple = (),
    scraped: tuple = (),
    prometheus_port: int | None = None,
) -> HostRules:
    """The input and output rules of `host` (a Spark, the storage node, the router, coordinator or monitoring host, or
    several). `scrapers`: the monitoring hosts' addresses; `scraped`: (what, port) of the exporters on `host`
    (kvtier.monitoring.targets); `prometheus_port`: the Prometheus `host` runs, if it is a monitoring host."""
    out = HostRules()
    sparks = {n.name: n for n in spec.nodes}
    addresses = tuple(n.data_address for n in spec.nodes)
    node = sparks.get(host)
    if node is not None:
        others = tuple(n.data_address for n in spec.nodes if n.name != host)
        if router is not None:
            out.input.append(
                Rule(
                    "vLLM's API: the router, the operator and the monitoring hosts",
                    "tcp",
                    node.ports.vllm_http,
                    (router.address, *admin, *scrapers),
                )
            )
        elif not _open_to_all(clients):
            out.input.append(
                Rule(
                    "vLLM's API: the clients (no router), the operator and the monitoring hosts",
                    "tcp",
                    node.ports.vllm_http,
                    (*clients, *admin, *scrapers),
                )
            )
        if spec.p2p is not None:
            out.input.append(Rule("LMCache's server: its peers' P2P lookups", "tcp", node.ports.lmcache_zmq, others))
            out.input.append(Rule("NIXL's side channel: its peers", "tcp", node.p2p_advertise_port, others))
            if spec.p2p.transfer_engine == "nixl":
                ports = spec.p2p.ucx_tcp_port_range
                out.input.append(Rule("NIXL's transfers over UCX's TCP transport: its peers", "tcp", ports, others))
        if service_uid is not None:
            owners = (0, service_uid)
            if spec.p2p is not None:
                out.output.append(
                    Rule(
                        "LMCache's servers: root and the service user only",
                        "tcp",
                        node.ports.lmcache_zmq,
                        addresses,
                        owners,
                    )
                )
            if spec.l2 is not None:
                out.output.append(
                    Rule("the L2 server: root and the service user only", "tcp", spec.l2.port, (spec.l2.host,), owners)
                )
    if spec.p2p is not None and spec.p2p.coordinator.node == host:
        out.input.append(Rule("the P2P coordinator: the Sparks", "tcp", spec.p2p.coordinator.port, addresses))
    if storage is not None and storage.host == host:
        if spec.l2 is not None:
            # The spec's L2 port derives from the storage node's kv_store_port (kvtier.cluster.derive).
            out.input.append(Rule("the L2 server: the Sparks", "tcp", spec.l2.port, addresses))
        if spec.l3 is not None:
            out.input.append(Rule("the NFS export: the Sparks", "tcp", NFS_PORT, addresses))
            out.input.append(Rule("rpcbind: the Sparks", "tcp", RPCBIND_PORT, addresses))
            out.input.append(Rule("rpcbind: the Sparks", "udp", RPCBIND_PORT, addresses))
            # Soft-RoCE carries RDMA in UDP through the kernel; a ConnectX NIC's RoCE bypasses netfilter.
            out.input.append(Rule("RoCEv2 (soft-RoCE): the Sparks", "udp", ROCEV2_PORT, addresses))
    if router is not None and router.host == host:
        if not _open_to_all(clients):
            out.input.append(Rule("the router: the clients", "tcp", router.port, tuple(clients)))
        out.input.append(Rule("the router's statistics page: the operator", "tcp", router.stats_port, tuple(admin)))
    for what, port in scraped:
        out.input.append(Rule(f"{what}: the monitoring hosts", "tcp", port, tuple(scrapers)))
    if prometheus_port is not None:
        out.input.append(Rule("Prometheus: the operator", "tcp", prometheus_port, tuple(admin)))
    return out
