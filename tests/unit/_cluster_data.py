"""A valid cluster spec dict shared by the cluster tests (a fresh deep copy per call)."""

import copy

_SPEC = {
    "model": {
        "id": "Qwen/Qwen3-8B",
        "path": "/opt/kvtier/models/Qwen3-8B",
        "max_model_len": 32768,
        "dtype": "bfloat16",
        "weights_gib": 16,
    },
    "vllm": {"block_size": 16, "gpu_kv_cache_gib": 40},
    "lmcache": {"chunk_size": 256, "l0_dram_gib": 32},
    "tiers": ["l0", "l1_p2p", "l2", "l3"],
    "l2": {
        "adapter": "resp",
        "host": "10.10.0.10",
        "port": 6379,
        "user": "lmcache",
        "password_var": "kv_store_lmcache_password",
    },
    "l3": {"adapter": "fs", "path": "/mnt/kvtier/lmcache"},
    "p2p": {"coordinator": {"node": "spark01", "port": 9300}, "advertise_port": 8500},
    "nodes": {
        "spark01": {"data_address": "10.10.0.21"},
        "spark02": {"data_address": "10.10.0.22"},
        "spark03": {"data_address": "10.10.0.23"},
    },
}

PASSWORD = "s3cret-Passw0rd-for-tests"


def spec_dict(**sections):
    """The valid spec, with whole sections replaced by keyword (tiers=[...], l3={...})."""
    data = copy.deepcopy(_SPEC)
    data.update(copy.deepcopy(sections))
    return data
