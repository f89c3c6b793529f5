"""The Spark serving configuration, from one cluster spec.

- `spec`: typed, validated cluster spec (`load_spec`, `validate`, `SpecError`, the dataclasses).
- `inventory`: builds the spec dict from Ansible hostvars and refuses per-host differences.
- `render`: per-node argv/env for `lmcache server`, vLLM and `lmcache coordinator`.
- `fingerprint`: hash of the settings that must agree across nodes.
- `systemd`: quoting of argv/env for unit files.
"""

from kvtier.cluster.fingerprint import fingerprint, fingerprint_inputs
from kvtier.cluster.inventory import cluster_from_hostvars
from kvtier.cluster.render import ProcessSpec, RenderError, coordinator, endpoints, lmcache_server, node_config, vllm
from kvtier.cluster.spec import ClusterSpec, SpecError, load_spec, validate

__all__ = [
    "ClusterSpec",
    "ProcessSpec",
    "RenderError",
    "SpecError",
    "cluster_from_hostvars",
    "coordinator",
    "endpoints",
    "fingerprint",
    "fingerprint_inputs",
    "lmcache_server",
    "load_spec",
    "node_config",
    "validate",
    "vllm",
]
