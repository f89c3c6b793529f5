"""kvtier.preflight: one test per check, asserting the exact message (plain dicts in, messages out)."""

import copy
import pathlib

from kvtier.preflight import controller, credentials, groups, hardware, network, tiers, varnames
from tests.unit import _cluster_data

ROOT = pathlib.Path(__file__).resolve().parents[2]
STORAGE = {
    "kvtier_data_address": "10.10.0.10",
    "roce_address": "10.10.0.10/24",
    "roce_interface": "enp1s0",
    "roce_mtu": 9000,
    "kv_store_port": 6379,
    "kv_store_lmcache_user": "lmcache",
}


def hosts(**changes):
    """kv-storage01 and spark01..03 on 10.10.0.0/24, with per-host changes (None removes a variable)."""
    views = {"kv-storage01": dict(STORAGE)}
    for n in (1, 2, 3):
        views[f"spark0{n}"] = {
            "kvtier_data_address": f"10.10.0.2{n}",
            "roce_address": f"10.10.0.2{n}/24",
            "roce_interface": "enp1s0",
            "roce_mtu": 9000,
        }
    for host, values in changes.items():
        for key, value in values.items():
            if value is None:
                views[host].pop(key, None)
            else:
                views[host][key] = value
    return views


def spark_hostvars(spec=None):
    """hostvars as Ansible gives them to the filter: kvtier_cluster on every Spark plus node host vars."""
    spec = spec or _cluster_data.spec_dict()
    nodes = spec.pop("nodes")
    return spec, {
        name: {"kvtier_cluster": copy.deepcopy(spec), **{f"kvtier_{k}": v for k, v in node.items()}}
        for name, node in nodes.items()
    }


# controller


def test_ansible_version_in_range():
    assert controller.ansible_version("2.19.14", "2.19", "2.20") == []


def test_ansible_version_too_new():
    assert controller.ansible_version("2.20.0rc1", "2.19", "2.20") == [
        "ansible-core 2.20.0rc1 is not supported: kvtier needs >= 2.19 and < 2.20 (preflight_ansible_min, "
        "preflight_ansible_max); install the pinned set with `pip install -r requirements.lock`"
    ]


def test_collection_missing_and_too_old():
    required = [
        {"name": "ansible.utils", "version": "6.0.0"},
        {"name": "ansible.posix", "version": "2.1.0"},
        {"name": "community.general", "version": "11.4.2"},
    ]
    installed = {"ansible.utils": "5.1.2", "ansible.posix": None, "community.general": "11.10.0"}
    assert controller.collections(required, installed) == [
        "collection ansible.utils 5.1.2 is older than 6.0.0 (requirements.yml): run "
        "`ansible-galaxy collection install -r requirements.yml --upgrade`",
        "collection ansible.posix is not installed (requirements.yml pins 2.1.0): run "
        "`ansible-galaxy collection install -r requirements.yml`",
    ]


def test_python_library_missing():
    assert controller.python_libraries({"netaddr": False, "jinja2": True}, "/venv/bin/python") == [
        "Python library netaddr is not importable by the controller's Python (/venv/bin/python), which runs "
        "ansible-playbook: install it there (`/venv/bin/python -m pip install netaddr`) or install the pinned set "
        "with `pip install -r requirements.lock`"
    ]


# groups


def test_groups_fine():
    assert groups.groups({"storage": ["s"], "spark": ["a", "b"]}) == []


def test_groups_two_storage_nodes_and_no_spark():
    assert groups.groups({"storage": ["s1", "s2"]}) == [
        "group storage must have exactly one host (the storage node); it has 2 (s1, s2): put the one storage node "
        "under all.children.storage.hosts",
        "group spark must have at least 1 host(s) (the DGX Spark serving nodes); it has none: put them under "
        "all.children.spark.hosts",
    ]


# network


def test_network_fine():
    assert network.addresses(hosts(), "kv-storage01") == []
    assert network.mtu(hosts()) == []


def test_data_address_missing_and_not_an_ip():
    views = hosts(
        spark01={"kvtier_data_address": None, "roce_address": None},
        spark02={"kvtier_data_address": "spark02.data", "roce_address": None},
    )
    assert network.addresses(views, "kv-storage01") == [
        "host spark01: kvtier_data_address is not set: give the host's address on the RoCE data network (a bare IP, "
        "e.g. 10.10.0.21)",
        "host spark02: kvtier_data_address 'spark02.data' is not an IP address: give the host's address on the RoCE "
        "data network (a bare IP, e.g. 10.10.0.21)",
    ]


def test_address_outside_the_configured_cidr():
    views = hosts(spark03={"kvtier_data_address": "10.20.0.23", "roce_address": "10.20.0.23/24"})
    assert network.addresses(views, "kv-storage01", "10.10.0.0/24") == [
        "host spark03: kvtier_data_address 10.20.0.23 is outside the data network 10.10.0.0/24 (preflight_data_cidr): "
        "use an address on the RoCE network",
        "host spark03: roce_address 10.20.0.23/24 is outside the data network 10.10.0.0/24 (preflight_data_cidr): "
        "use an address on the RoCE network",
    ]


def test_data_cidr_invalid():
    assert network.addresses(hosts(), "kv-storage01", "10.10.0.1/24") == [
        "preflight_data_cidr '10.10.0.1/24' is not a network in CIDR form: give the data network, e.g. 10.10.0.0/24"
    ]


def test_roce_address_without_prefix_wrong_prefix_and_other_ip():
    views = hosts(
        spark01={"roce_address": "10.10.0.21"},
        spark02={"roce_address": "10.10.0.22/16"},
        spark03={"roce_address": "10.10.0.33/24"},
    )
    assert network.addresses(views, "kv-storage01") == [
        "host spark01: roce_address '10.10.0.21' is not a host address with a prefix length: write it like "
        "10.10.0.21/24",
        "host spark02: roce_address 10.10.0.22/16 has prefix /16, but the data network is 10.10.0.0/24 (roce_address "
        "of kv-storage01): use /24 on every node",
        "host spark03: kvtier_data_address 10.10.0.23 is not the address of roce_address 10.10.0.33/24: the data "
        "address must be the one on the RoCE interface",
    ]


def test_roce_interface_missing_and_invalid():
    views = hosts(spark01={"roce_interface": None}, spark02={"roce_interface": "a-very-long-netdev-name"})
    assert network.addresses(views, "kv-storage01") == [
        "host spark01: roce_address is set but roce_interface is not: name the RoCE NIC's netdev (e.g. enp1s0f0np0)",
        "host spark02: roce_interface 'a-very-long-netdev-name' is not a netdev name (letters, digits, '_', '.', '-', "
        "at most 15 characters)",
    ]


def test_duplicate_address():
    views = hosts(spark02={"kvtier_data_address": "10.10.0.21", "roce_address": None})
    assert network.addresses(views, "kv-storage01") == [
        "address 10.10.0.21 is used by more than one host: spark01 (kvtier_data_address), spark02 "
        "(kvtier_data_address): give each node its own address"
    ]


def test_nfs_client_server_not_the_storage_data_address():
    views = hosts(
        spark01={"nfs_client_server": "192.168.1.10"},
        spark02={"nfs_client_server": "10.10.0.10"},
        spark03={"nfs_client_server": "storage.example"},
    )
    assert network.addresses(views, "kv-storage01") == [
        "host spark01: nfs_client_server 192.168.1.10 is not the storage node's data address (kv-storage01 "
        "kvtier_data_address 10.10.0.10): mount over the RoCE network"
    ]


def test_mtu_differs_and_string():
    views = hosts(spark01={"roce_mtu": 1500}, spark02={"roce_mtu": "9000"})
    assert network.mtu(views) == [
        "host spark02: roce_mtu '9000' is not an integer: write it unquoted, e.g. 9000",
        "roce_mtu differs between nodes (1500 on spark01; 9000 on kv-storage01, spark03): the RDMA path MTU follows "
        "the smallest and mismatched MTUs drop large frames; set one roce_mtu for all nodes (group_vars/all)",
    ]


# tiers


def test_spec_valid():
    cluster, hostvars = spark_hostvars()
    spec_dict, problems = tiers.spec_problems(cluster, hostvars, sorted(hostvars))
    assert problems == [] and sorted(spec_dict["nodes"]) == ["spark01", "spark02", "spark03"]


def test_spec_missing():
    assert tiers.spec_problems(None, {"spark01": {}}, ["spark01"]) == (
        None,
        [
            "kvtier_cluster is not set: define the cluster spec once in group_vars/all (see kvtier/cluster/spec.py for "
            "its shape)"
        ],
    )


def test_spec_problems_come_from_kvtier_cluster():
    cluster, hostvars = spark_hostvars(_cluster_data.spec_dict(lmcache={"chunk_size": 100, "l0_dram_gib": 32}))
    assert tiers.spec_problems(cluster, hostvars, sorted(hostvars)) == (
        None,
        [
            "kvtier_cluster: lmcache.chunk_size 100 is not a multiple of vllm.block_size 16: the LMCache connector "
            "refuses to start; set lmcache.chunk_size to a multiple of 16 (e.g. 96 or 112)"
        ],
    )


def test_spec_defined_differently_on_one_host():
    cluster, hostvars = spark_hostvars()
    hostvars["spark02"]["kvtier_cluster"]["vllm"]["block_size"] = 32
    assert tiers.spec_problems(cluster, hostvars, sorted(hostvars)) == (
        None,
        [
            "kvtier_cluster: kvtier_cluster differs between spark01 and spark02 at vllm.block_size (16 vs 32): "
            "define it "
            "once (group_vars/all), never per group or per host"
        ],
    )


def test_l2_and_l3_disagree_with_the_storage_node():
    spec = _cluster_data.spec_dict(
        l2={
            "adapter": "resp",
            "host": "10.10.0.99",
            "port": 6380,
            "user": "lmcache",
            "password_var": "kv_store_lmcache_password",
        }
    )
    spark = {
        "spark01": {"nfs_client_server": "10.10.0.10", "nfs_client_mount_point": "/mnt/kvcache"},
        "spark02": {"nfs_client_mount_point": "/mnt/kvcache"},
    }
    assert tiers.storage_agreement(spec, "kv-storage01", STORAGE, spark) == [
        "kvtier_cluster.l2.host is 10.10.0.99, but the storage node kv-storage01 has kvtier_data_address 10.10.0.10: "
        "LMCache would never reach its L2 tier; make them equal",
        "kvtier_cluster.l2.port is 6380, but the storage node kv-storage01 has kv_store_port 6379: LMCache would never "
        "reach its L2 tier; make them equal",
        "host spark01: kvtier_cluster.l3.path /mnt/kvtier/lmcache is not under its NFS mount nfs_client_mount_point "
        "/mnt/kvcache: the L3 tier would be a local directory, not the shared NVMe pool; put l3.path below the mount "
        "point",
    ]


# credentials


def test_credentials_fine():
    assert credentials.credentials([("s", "kv_store_lmcache_password", "x" * 24)]) == []


def test_credentials_problems_name_hosts_never_values():
    values = [
        ("s", "kv_store_lmcache_password", "ChangeMe"),
        ("s", "kv_store_admin_password", None),
        ("a", "kv_store_lmcache_password", "ChangeMe"),
        ("s", "other_password", "tiny-pw"),
        ("s", "spaced_password", "a password with spaces"),
    ]
    problems = credentials.credentials(values)
    assert problems == [
        "kv_store_lmcache_password still has an example value: replace it with a generated one (openssl rand "
        "-base64 32) in a vault (hosts: s, a)",
        "kv_store_admin_password is not set: define it in a vault (see inventory/example/group_vars/all/vault.yml) "
        "(hosts: s)",
        "other_password is shorter than 16 characters: use a generated one (openssl rand -base64 32) (hosts: s)",
        "spaced_password contains whitespace, which the server's ACL file cannot hold: use a generated one (hosts: s)",
    ]
    assert not any(secret in p for p in problems for secret in ("ChangeMe", "tiny-pw", "with spaces"))


def test_client_password_differs_from_the_server():
    server = ("kv-storage01", "kv_store_lmcache_password", "a" * 20)
    clients = [("spark01", "vault_l2", "a" * 20), ("spark02", "vault_l2", "b" * 20)]
    assert credentials.same_secret(server, clients) == [
        "host spark02: vault_l2 differs from kv_store_lmcache_password on kv-storage01: LMCache on spark02 would fail "
        "to log in to L2; point kvtier_cluster.l2.password_var at the same vaulted value"
    ]


# variable names


def test_known_variables_come_from_the_roles():
    roles = varnames.read_roles(ROOT / "roles")
    assert roles.public["roce_mtu"] == "roce" and roles.public["kvtier_cluster"] == "vllm_lmcache"
    assert roles.internal["kv_store_flavors"] == "kv_store"
    assert roles.prefixes["nfs_client_"] == "nfs_client" and roles.prefixes["preflight_"] == "preflight"


def test_misspelt_removed_internal_and_unknown_variables():
    roles = varnames.read_roles(ROOT / "roles")
    names = {
        "spark01": ["roce_mtus", "ansible_host", "kvtier_data_address", "vault_x"],
        "spark02": ["roce_mtus", "nvme_raid_members", "kv_store_flavors", "vllm_lmcache_zzz_qqq"],
    }
    assert varnames.unknown_variables(names, roles, {"nvme_raid_members": "use nvme_raid_serials"}) == [
        "kv_store_flavors (set for spark02) is internal to role kv_store (roles/kv_store/vars/main.yml) and overrides "
        "nothing from the inventory: remove it",
        "nvme_raid_members (set for spark02) was removed: use nvme_raid_serials",
        "roce_mtus (set for spark01, spark02) is not a variable of any kvtier role (did you mean roce_mtu?): rename "
        "or remove it",
        "vllm_lmcache_zzz_qqq (set for spark02) is not a variable of any kvtier role (see "
        "roles/vllm_lmcache/meta/argument_specs.yml for the known names): rename or remove it",
    ]


# hardware


def _drive(serial, model="SOLIDIGM SBFPF2BU153T", backs_root=False):
    return {"serial": serial, "model": model, "backs_root": backs_root}


def test_drives_by_model_family():
    drives = [_drive(f"S{n}") for n in range(6)] + [_drive("R", "Samsung SSD 990", backs_root=True)]
    assert hardware.storage_drives("s", drives, 8, "^SOLIDIGM (SBFP|SB5P)") == [
        "host s: 6 NVMe drive(s) match nvme_raid_model_pattern '^SOLIDIGM (SBFP|SB5P)', but nvme_raid_drive_count is "
        "8 (models found: SOLIDIGM SBFPF2BU153T): set the pattern to your drives' model family, or list the members "
        "in nvme_raid_serials"
    ]
    assert hardware.storage_drives("s", drives, 6, "^SOLIDIGM (SBFP|SB5P)") == []


def test_drives_by_serial():
    assert hardware.storage_drives("s", [_drive("A"), _drive("B")], 8, "x", ["A", "C"]) == [
        "host s: NVMe drives with serials C (nvme_raid_serials) are not present; found A, B: fix nvme_raid_serials "
        "or seat the drives"
    ]


def test_spark_memory_budget():
    spec = _cluster_data.spec_dict()
    assert hardware.spark_memory("spark01", 128 * 1024, spec) == []
    assert hardware.spark_memory("spark01", 64 * 1024, spec) == [
        "host spark01: memory budget model.weights_gib 16 + vllm.gpu_kv_cache_gib 40 + lmcache.l0_dram_gib 32 + "
        "memory.runtime_overhead_gib 4 + memory.os_reserve_gib 8 = 100 GiB is more than the 64.0 GiB it has "
        "(ansible_facts.memtotal_mb); lower lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib, and set "
        "kvtier_unified_memory_gib to what the host has (now 119)"
    ]


def test_nic_missing():
    assert hardware.nic("spark01", ["lo", "eth0"], "enp1s0f0np0") == [
        "host spark01: roce_interface enp1s0f0np0 is not a network interface of the host (found: eth0, lo): set "
        "roce_interface to the RoCE NIC's netdev"
    ]
    assert hardware.nic("spark01", ["lo", "enp1s0f0np0"], "enp1s0f0np0") == []


# --- the RDMA stack (MOFED or the kernel's) ----------------------------------------------------------------------

KERNEL_RPCRDMA = "/lib/modules/6.8.0-1015-nvidia/kernel/net/sunrpc/xprtrdma/rpcrdma.ko.zst"
MOFED_RPCRDMA = "/lib/modules/6.8.0-1015-nvidia/updates/dkms/rpcrdma.ko"


def test_rdma_stack_consistent():
    assert hardware.rdma_stack("s", {"ofed": "", "mlx_compat": "", "rpcrdma": KERNEL_RPCRDMA}) == []
    mofed = {"ofed": "MLNX_OFED_LINUX-24.10-1.1.4.0:", "mlx_compat": "/lib/modules/x/updates/dkms/mlx_compat.ko"}
    assert hardware.rdma_stack("s", {**mofed, "rpcrdma": MOFED_RPCRDMA}) == []


def test_rdma_stack_mofed_with_the_kernels_rpcrdma():
    (problem,) = hardware.rdma_stack(
        "kv-storage01", {"ofed": "", "mlx_compat": "/x/extra/mlx_compat.ko", "rpcrdma": KERNEL_RPCRDMA}
    )
    assert problem.startswith("host kv-storage01: MOFED is installed but rpcrdma is the kernel's own")
    assert "mlnx-nfsrdma" in problem


def test_rdma_stack_leftover_and_missing_module():
    (leftover,) = hardware.rdma_stack("spark01", {"rpcrdma": MOFED_RPCRDMA})
    assert "leftover of a removed MOFED" in leftover and "depmod" in leftover
    (missing,) = hardware.rdma_stack("spark01", {"rpcrdma": ""})
    assert "no rpcrdma module" in missing and "linux-modules-extra" in missing
    (missing,) = hardware.rdma_stack("spark01", {"ofed": "MLNX_OFED_LINUX-24.10", "rpcrdma": ""})
    assert "mlnx-nfsrdma" in missing


def test_spark_free_memory_counts_what_kvtiers_services_hold():
    spec = _cluster_data.spec_dict()
    # Weights 16 + KV 40 + LMCache DRAM 32 + runtime 4 = 92 GiB must be free (the OS reserve is already taken).
    assert hardware.spark_free_memory("spark01", 92 * 1024, 0, spec) == []
    assert hardware.spark_free_memory("spark01", 30 * 1024, 62 * 2**20, spec) == []
    assert hardware.spark_free_memory("spark01", 80 * 1024, 2 * 2**20, spec) == [
        "host spark01: the services need model.weights_gib 16 + vllm.gpu_kv_cache_gib 40 + lmcache.l0_dram_gib 32 + "
        "memory.runtime_overhead_gib 4 = 92 GiB, but 82.0 GiB is free (80.0 GiB available, "
        "ansible_facts.memory_mb.nocache.free, + 2.0 GiB held by kvtier's own services): 10.0 GiB short. Stop what "
        "else uses the memory, or lower lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib"
    ]


def test_the_l2_admin_password_is_not_lmcaches():
    same = [("st", "kv_store_lmcache_password", "x" * 20), ("st", "kv_store_admin_password", "x" * 20)]
    assert credentials.distinct_secrets(same, "kv_store_lmcache_password", "kv_store_admin_password") == [
        "host st: kv_store_lmcache_password and kv_store_admin_password are the same password: whoever holds "
        "LMCache's (every Spark does) could administer L2; give kv_store_admin_password a password of its own"
    ]
    apart = [same[0], ("st", "kv_store_admin_password", "y" * 20)]
    assert credentials.distinct_secrets(apart, "kv_store_lmcache_password", "kv_store_admin_password") == []
