"""Jinja2 filters that render the Spark serving configuration from the one cluster spec (controller side).

    kvtier_spec_dict: "{{ kvtier_cluster | kvtier_spec(hostvars, groups['spark']) }}"  # + node host vars
    problems:         "{{ kvtier_spec_dict | kvtier_validate }}"          # [] when valid
    lmcache:          "{{ kvtier_spec_dict | kvtier_lmcache_server(inventory_hostname, kv_store_lmcache_password) }}"
    vllm:             "{{ kvtier_spec_dict | kvtier_vllm(inventory_hostname) }}"
    coordinator:      "{{ kvtier_spec_dict | kvtier_coordinator(inventory_hostname) }}"   # None if not here
    fingerprint:      "{{ kvtier_spec_dict | kvtier_fingerprint }}"
    ExecStart={{ lmcache.argv | kvtier_systemd_exec }}
    {% for a in lmcache.env | kvtier_systemd_env %}Environment={{ a }}{% endfor %}

Each render filter returns {"argv": [...], "env": {...}, "secret_env": {...}}. secret_env holds credentials:
write it to a root-only EnvironmentFile with no_log, never into the unit or a log.
"""

from __future__ import annotations

import pathlib
import sys

from ansible.errors import AnsibleFilterError

try:
    from kvtier import cluster as _cluster
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from kvtier import cluster as _cluster
from kvtier.cluster import inventory as _inventory
from kvtier.cluster import render as _render
from kvtier.cluster import systemd as _systemd


def _load(spec_dict):
    try:
        return _cluster.load_spec(_inventory.plain(spec_dict))
    except _cluster.SpecError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _guard(func, *args):
    try:
        return func(*args)
    except (_cluster.SpecError, _render.RenderError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from None


def kvtier_spec(cluster, hostvars, hosts, var=_inventory.CLUSTER_VAR):
    """The validated spec dict: kvtier_cluster (defined once for all hosts) plus each host's node vars."""
    spec_dict = _guard(_inventory.cluster_from_hostvars, cluster, hostvars, hosts, var)
    _load(spec_dict)
    return spec_dict


def kvtier_validate(spec_dict):
    """Every problem in the spec, each saying what to change; [] when valid."""
    return _cluster.validate(_inventory.plain(spec_dict))


def kvtier_lmcache_server(spec_dict, node, l2_password=None):
    return _guard(_render.lmcache_server, _load(spec_dict), str(node), l2_password).to_dict()


def kvtier_vllm(spec_dict, node):
    return _guard(_render.vllm, _load(spec_dict), str(node)).to_dict()


def kvtier_coordinator(spec_dict, host):
    process = _render.coordinator(_load(spec_dict), str(host))
    return None if process is None else process.to_dict()


def kvtier_node(spec_dict, node, l2_password=None):
    return _guard(_render.node_config, _load(spec_dict), str(node), l2_password)


def kvtier_endpoints(spec_dict, node):
    """The URLs a probe on `node` uses (no secrets needed, unlike kvtier_node)."""
    return _guard(_render.endpoints, _load(spec_dict), str(node))


def kvtier_fingerprint(spec_dict):
    return _cluster.fingerprint(_load(spec_dict))


def kvtier_systemd_exec(argv):
    return _guard(_systemd.exec_line, [str(a) for a in argv])


def kvtier_systemd_env(env):
    return [_guard(_systemd.environment_assignment, str(k), str(v)) for k, v in sorted(dict(env).items())]


class FilterModule:
    def filters(self):
        return {
            "kvtier_spec": kvtier_spec,
            "kvtier_validate": kvtier_validate,
            "kvtier_lmcache_server": kvtier_lmcache_server,
            "kvtier_vllm": kvtier_vllm,
            "kvtier_coordinator": kvtier_coordinator,
            "kvtier_node": kvtier_node,
            "kvtier_endpoints": kvtier_endpoints,
            "kvtier_fingerprint": kvtier_fingerprint,
            "kvtier_systemd_exec": kvtier_systemd_exec,
            "kvtier_systemd_env": kvtier_systemd_env,
        }
