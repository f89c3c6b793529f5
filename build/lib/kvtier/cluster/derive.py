"""Settings one host takes from another host's variables, derived here and nowhere else.

The way kubespray derives its cluster addresses: a Spark's L2 endpoint is the storage node's own
`kvtier_data_address`, `kv_store_port` and `kv_store_lmcache_user`, so none of them is written twice. An
operator who sets `kvtier_cluster.l2.host/port/user` explicitly overrides the derivation, and preflight then
checks that the explicit value agrees with the storage node.

The kv_store role's defaults (roles/kv_store/defaults/main.yml) are the one definition of its port and user
names; they are read from that file (in the checkout, or where kvtier is installed: kvtier.content), because another
host's role defaults are not in Ansible's hostvars.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import yaml

from kvtier import content

STORAGE_GROUP = "storage"
SPARK_GROUP = "spark"
# spec l2 key -> the storage node's variable it comes from.
L2_FROM_STORAGE = {"host": "kvtier_data_address", "port": "kv_store_port", "user": "kv_store_lmcache_user"}
# The storage node's variables the derivations read (with the kv_store role's defaults under them).
STORAGE_VARS = ("kvtier_data_address", "kv_store_port", "kv_store_lmcache_user", "kv_store_admin_user")


@functools.lru_cache(maxsize=None)
def role_defaults(role: str) -> dict:
    """A role's defaults/main.yml as written (kvtier's kv_store defaults are literals, never templates); ContentMissing
    when kvtier's roles cannot be found, so that nothing is derived from defaults that are not there."""
    path = content.root() / "roles" / role / "defaults" / "main.yml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return data if isinstance(data, dict) else {}


def storage_settings(storage_vars: Mapping | None) -> dict:
    """The storage node's `STORAGE_VARS`: its own values over the kv_store role's defaults."""
    defaults = role_defaults("kv_store")
    settings = {name: defaults[name] for name in STORAGE_VARS if name in defaults}
    settings.update({k: v for k, v in (storage_vars or {}).items() if k in STORAGE_VARS and v not in (None, "")})
    return settings


# The export's squashed identity (nfs_server's all_squash): what owns everything a Spark writes on the L3 mount.
SQUASH_VARS = {"uid": "nfs_server_anon_uid", "gid": "nfs_server_anon_gid"}


def l3_owner(storage_vars: Mapping | None) -> dict:
    """{uid, gid} that own the L3 directory on the NFS export: the storage node's squashed identity, over the
    nfs_server role's defaults. Every write from any Spark lands as it, and a chown to a Spark's own user would be
    refused by the server, so the directory is made with this owner, not the service user's."""
    defaults = role_defaults("nfs_server")
    found = {key: (storage_vars or {}).get(var, defaults.get(var)) for key, var in SQUASH_VARS.items()}
    return {key: int(value) for key, value in found.items()}


def l2_endpoint(storage_vars: Mapping | None) -> dict:
    """{host, port, user} of the L2 server as the storage node defines it (host absent without a data address)."""
    settings = storage_settings(storage_vars)
    return {key: settings[var] for key, var in L2_FROM_STORAGE.items() if var in settings}


def with_l2_endpoint(cluster: Mapping, storage_vars: Mapping | None) -> dict:
    """`cluster` with l2.host/port/user filled from the storage node where the spec leaves them out."""
    cluster = dict(cluster)
    if "l2" not in (cluster.get("tiers") or []) or storage_vars is None:
        return cluster
    l2 = dict(cluster.get("l2") or {})
    for key, value in l2_endpoint(storage_vars).items():
        if l2.get(key) is None:
            l2[key] = value
    cluster["l2"] = l2
    return cluster


# A Spark's own variables that decide where NIXL's UCX traffic goes and how it is marked: the roce role's data
# interfaces and QoS, and the RDMA devices the vllm_lmcache role found behind them (`rdma link`, at run time).
FABRIC_VARS = (
    "kvtier_rdma_fabric",
    "roce_interface",
    "roce_extra_interfaces",
    "roce_soft_roce",
    "roce_qos_enabled",
    "roce_qos_tos",
    "vllm_lmcache_rdma_devices",
)


def flag(value) -> bool:
    """An inventory boolean (YAML true/false, or a string an extra var gave)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def tcp_only(ucx_tls) -> bool:
    """True when UCX_TLS leaves UCX only its TCP transport (UCX then names devices by netdev, not mlx5_N:port)."""
    words = {w.strip() for w in str(ucx_tls or "").split(",") if w.strip()}
    return bool(words) and words <= {"tcp", "self", "^rc", "^ud", "^dc"}


def data_interfaces(node_vars: Mapping) -> list:
    """The netdevs that carry the node's RoCE traffic: roce_interface, then roce_extra_interfaces in order."""
    names = [node_vars.get("roce_interface")]
    names += [
        item.get("interface") for item in node_vars.get("roce_extra_interfaces") or [] if isinstance(item, Mapping)
    ]
    return [str(n) for n in names if n]


def ucx_fabric(node_vars: Mapping, p2p: Mapping | None) -> dict:
    """The node keys ucx_net_devices / ucx_traffic_class derived from its fabric, for those it leaves unset.

    UCX_NET_DEVICES pins NIXL to the RoCE ports (UCX would otherwise use every device it finds, the management
    NIC included): the RDMA devices behind the data interfaces (`mlx5_N:port` style names, found on the node), or
    the netdevs themselves when UCX_TLS is TCP only. UCX_IB_TRAFFIC_CLASS puts P2P transfers in the lossless class
    the roce role configures (its ToS: the PFC priority's DSCP with ECN capable), so they share PFC/ECN with
    NFS/RDMA; not on soft-RoCE or with QoS off, where no lossless class exists. A host without the RDMA fabric
    (kvtier_rdma_fabric: false) or without a roce_interface derives nothing.
    """
    if not flag(node_vars.get("kvtier_rdma_fabric", True)) or p2p is None or not data_interfaces(node_vars):
        return {}
    if str(p2p.get("transfer_engine") or "nixl") != "nixl":
        return {}
    defaults = role_defaults("roce")

    def var(name):
        value = node_vars.get(name)
        return defaults.get(name) if value is None else value

    derived: dict = {}
    if tcp_only(p2p.get("ucx_tls")):
        devices = data_interfaces(node_vars)
    else:
        devices = [str(d) for d in node_vars.get("vllm_lmcache_rdma_devices") or []]
        if not flag(var("roce_soft_roce")) and flag(var("roce_qos_enabled")):
            derived["ucx_traffic_class"] = int(var("roce_qos_tos"))
    if devices:
        derived["ucx_net_devices"] = ",".join(devices)
    return derived
