"""What the tier proof needs to know about a running cluster, read from the inventory that provisioned it.

The cluster spec (`kvtier_cluster` plus each Spark's node variables) is assembled and validated by the same
code the roles render from, so the proof talks to the ports, model and tiers the cluster really has.
"""

from __future__ import annotations

import dataclasses

from kvtier.cluster import cluster_from_hostvars, derive, endpoints, load_spec
from kvtier.cluster.render import tier_adapters
from kvtier.cluster.spec import NODE_KEYS, ClusterSpec, SpecError
from kvtier.inventory import Inventory, InventoryError
from kvtier.nodes import transport as nodes

SPARK_GROUP = derive.SPARK_GROUP
# The systemd units the vllm_lmcache role installs (roles/vllm_lmcache/vars/main.yml).
UNITS = {"lmcache": "kvtier-lmcache.service", "vllm": "kvtier-vllm.service"}
_CONNECTION_VARS = (
    "ansible_connection",
    "ansible_host",
    "ansible_user",
    "ansible_port",
    "ansible_become",
    "ansible_become_method",
    "ansible_become_user",
    "ansible_become_password",
    "ansible_become_pass",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
)


# Per-Spark variables the health checks read (the roles' defaults fill in what is unset).
_HEALTH_VARS = ("kvtier_rdma_fabric", "roce_mtu", "nfs_client_io_size", "vllm_lmcache_config_dir")
# Where the L3 evictor runs and what it writes (playbooks/l3_evictor.yml, roles/l3_evictor).
_EVICTOR_VARS = ("kvtier_l3_evictor_node", "l3_evictor_enabled", "l3_evictor_textfile")
# The LMCache server's secrets file in its configuration directory (roles/vllm_lmcache/vars/main.yml).
SECRETS_FILE_NAME = "lmcache-secrets.env"
# What every host on the RoCE fabric is checked against (the storage node's too).
_FABRIC_VARS = ("roce_interface", "roce_extra_interfaces", "roce_mtu")


class TargetError(Exception):
    pass


@dataclasses.dataclass
class Target:
    spec: ClusterSpec
    nodes: dict  # Spark name -> nodes.Node
    # The L2 admin account (FLUSHALL for the proof of L3 and P2P); None when the inventory has no password.
    l2_admin_user: str | None = None
    l2_admin_password: str | None = dataclasses.field(default=None, repr=False)
    units: dict = dataclasses.field(default_factory=lambda: dict(UNITS))
    # What health reads besides the Sparks: the storage node, LMCache's own L2 password, the L3 array's name.
    storage: nodes.Node | None = None
    l2_password: str | None = dataclasses.field(default=None, repr=False)
    array_name: str | None = None
    rdma_fabric: dict = dataclasses.field(default_factory=dict)  # Spark -> has an RDMA fabric (NFS mount)
    # Host on the fabric -> {interfaces, mtu, io_size}: its RoCE netdevs, the fabric's MTU, the NFS rsize/wsize.
    fabric: dict = dataclasses.field(default_factory=dict)
    # The LMCache server's secrets file on every Spark: its L2 login when it does not run.
    secrets_file: str = f"/etc/kvtier/{SECRETS_FILE_NAME}"
    # The L3 evictor's host and textfile; None where the cluster has no L3 or the evictor is turned off.
    l3_evictor: nodes.Node | None = None
    l3_evictor_textfile: str = ""

    @property
    def model(self) -> str:
        return self.spec.model.served_name

    def vllm_url(self, host: str) -> str:
        return endpoints(self.spec, host)["vllm"]

    def lmcache_url(self, host: str) -> str:
        return endpoints(self.spec, host)["lmcache_http"]

    @property
    def l2_name(self) -> str | None:
        """The l2_name label of the L2 tier in LMCache's counters (its adapter type)."""
        return self.spec.l2.adapter if self.spec.l2 is not None else None

    @property
    def l3_name(self) -> str | None:
        return self.spec.l3.adapter if self.spec.l3 is not None else None

    @property
    def lower_tiers(self) -> list:
        """[(tier, adapter name)] of L2 and L3 in the order LMCache looks them up (a chunk loads from the first
        that holds it): proving a tier means emptying the ones before it."""
        return [(t, a) for t, a in tier_adapters(self.spec).items() if t in ("l2", "l3")]


def from_inventory(inventory: Inventory) -> Target:
    """The Target for the Sparks of an inventory (group `spark`), reached as Ansible reaches them."""
    sparks = inventory.group(SPARK_GROUP)
    if not sparks:
        raise TargetError(f"inventory {inventory.path} has no hosts in the group {SPARK_GROUP!r}")
    wanted = (
        "kvtier_cluster",
        *(f"kvtier_{k}" for k in NODE_KEYS),
        *derive.FABRIC_VARS,
        *_CONNECTION_VARS,
        *_HEALTH_VARS,
        *_EVICTOR_VARS,
    )
    try:
        hostvars = {host: inventory.hostvars(host, *wanted) for host in sparks}
        storage = inventory.group(derive.STORAGE_GROUP)
        storage_vars = inventory.hostvars(storage[0], *derive.STORAGE_VARS) if len(storage) == 1 else None
        cluster = hostvars[sparks[0]].get("kvtier_cluster")
        spec = load_spec(cluster_from_hostvars(cluster, hostvars, sparks, storage_vars=storage_vars))
        storage_host = (
            inventory.hostvars(
                storage[0], "kv_store_admin_password", "nvme_raid_name", *_FABRIC_VARS, *_CONNECTION_VARS
            )
            if len(storage) == 1
            else {}
        )
        password_var = spec.l2.password_var if spec.l2 is not None else None
        l2_password = inventory.hostvars(sparks[0], password_var).get(password_var) if password_var else None
        evictor = _evictor(inventory, spec, hostvars[sparks[0]], storage)
    except (InventoryError, SpecError) as exc:
        raise TargetError(str(exc)) from None
    raid_defaults = derive.role_defaults("nvme_raid")
    config_dir = hostvars[sparks[0]].get("vllm_lmcache_config_dir") or derive.role_defaults("vllm_lmcache").get(
        "vllm_lmcache_config_dir"
    )
    return Target(
        spec=spec,
        nodes={host: nodes.from_hostvars(host, hostvars[host]) for host in sparks},
        l2_admin_user=derive.storage_settings(storage_vars).get("kv_store_admin_user"),
        l2_admin_password=storage_host.get("kv_store_admin_password"),
        storage=nodes.from_hostvars(storage[0], storage_host) if len(storage) == 1 else None,
        l2_password=l2_password,
        array_name=storage_host.get("nvme_raid_name", raid_defaults.get("nvme_raid_name")),
        rdma_fabric={h: bool(hostvars[h].get("kvtier_rdma_fabric", True)) for h in sparks},
        fabric=_fabric(hostvars, sparks, storage[0] if len(storage) == 1 else None, storage_host),
        secrets_file=f"{config_dir}/{SECRETS_FILE_NAME}",
        l3_evictor=evictor[0],
        l3_evictor_textfile=evictor[1],
    )


def _evictor(inventory: Inventory, spec: ClusterSpec, spark_vars: dict, storage: list) -> tuple:
    """(the L3 evictor's node, its textfile), as playbooks/l3_evictor.yml places it: kvtier_l3_evictor_node, else
    the storage node; (None, "") without L3, with the evictor turned off, or when that host is not in the
    inventory (the playbook refuses that)."""
    defaults = derive.role_defaults("l3_evictor")
    enabled = spark_vars.get("l3_evictor_enabled", defaults.get("l3_evictor_enabled", True))
    host = spark_vars.get("kvtier_l3_evictor_node") or (storage[0] if storage else None)
    if spec.l3 is None or not enabled or host is None or host not in inventory.group("all"):
        return None, ""
    textfile = spark_vars.get("l3_evictor_textfile") or defaults.get("l3_evictor_textfile")
    return nodes.from_hostvars(host, inventory.hostvars(host, *_CONNECTION_VARS)), textfile


def _fabric(hostvars: dict, sparks: list, storage: str | None, storage_vars: dict) -> dict:
    """{host: {interfaces, mtu, io_size}} for each host on the RoCE fabric with a roce_interface."""
    roce, nfs = derive.role_defaults("roce"), derive.role_defaults("nfs_client")
    hosts = {h: hostvars[h] for h in sparks if derive.flag(hostvars[h].get("kvtier_rdma_fabric", True))}
    if storage is not None:
        hosts[storage] = storage_vars
    out = {}
    for host, variables in hosts.items():
        interfaces = derive.data_interfaces(variables)
        if interfaces:
            out[host] = {
                "interfaces": interfaces,
                "mtu": int(variables.get("roce_mtu") or roce.get("roce_mtu")),
                "io_size": int(variables.get("nfs_client_io_size") or nfs.get("nfs_client_io_size")),
            }
    return out
