"""A fingerprint of the settings that must agree on every node.

Two LMCache instances that differ in any of these (model identity, KV dtype, chunk and block size, hash
algorithm and seed, software versions, the shared L2/L3 stores, the P2P coordinator) compute different
cache keys or look in different places: the result is zero hits and no error. Every node's services carry
the same fingerprint (KVTIER_FINGERPRINT in their environment), so the health check can compare nodes.
Node-local values (addresses, ports, memory sizes) and secrets are deliberately left out.
"""

from __future__ import annotations

import hashlib
import json

from kvtier.cluster.spec import ClusterSpec


def fingerprint_inputs(spec: ClusterSpec) -> dict:
    """The cross-node settings, as a plain dict (what the fingerprint hashes)."""
    model, lmc = spec.model, spec.lmcache
    return {
        "software": {"lmcache": spec.install.lmcache_version, spec.install.vllm_package: spec.install.vllm_version},
        "model": {
            "engine_model": model.engine_model,
            "id": model.id,
            "served_name": model.served_name,
            "dtype": model.dtype,
            "kv_cache_dtype": model.kv_cache_dtype,
        },
        "chunk_size": lmc.chunk_size,
        "block_size": spec.vllm.block_size,
        "hash_algorithm": lmc.hash_algorithm,
        "python_hash_seed": lmc.python_hash_seed if lmc.seed_matters else None,
        "tiers": list(spec.tiers),
        "l2": None
        if spec.l2 is None
        else {"adapter": spec.l2.adapter, "host": spec.l2.host, "port": spec.l2.port, "user": spec.l2.user},
        "l3": None
        if spec.l3 is None
        else {
            "adapter": spec.l3.adapter,
            "path": spec.l3.path,
            "nixl_backend": spec.l3.nixl_backend if spec.l3.adapter != "fs" else None,
        },
        "p2p": None
        if spec.p2p is None
        else {"coordinator": spec.p2p.coordinator.url, "transfer_engine": spec.p2p.transfer_engine},
    }


def fingerprint(spec: ClusterSpec) -> str:
    """sha256 (hex) of the canonical JSON of `fingerprint_inputs`."""
    canonical = json.dumps(fingerprint_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
