"""Filters of the vllm_lmcache role: the non-secret facts it needs from the cluster spec.

    facts: "{{ spec_dict | vllm_lmcache_facts(inventory_hostname) }}"
    lock:  "{{ lookup('file', wheelhouse ~ '/lock.txt') | vllm_lmcache_lock }}"

The values come from kvtier.cluster (defaults included), so the role never repeats a default of the spec.
"""

from __future__ import annotations

import pathlib
import sys

from ansible.errors import AnsibleFilterError

try:
    from kvtier import cluster as _cluster
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
    from kvtier import cluster as _cluster
from kvtier.cluster import inventory as _inventory
from kvtier.cluster import render as _render


def _normalize(name: str) -> str:
    return "".join("-" if c in "_." else c for c in name.strip().lower())


def vllm_lmcache_facts(spec_dict, host):
    """Install, model, tier and endpoint facts for `host` (a serving node or the coordinator host)."""
    try:
        spec = _cluster.load_spec(_inventory.plain(spec_dict))
    except _cluster.SpecError as exc:
        raise AnsibleFilterError(str(exc)) from None
    host = str(host)
    is_node = any(n.name == host for n in spec.nodes)
    inst = spec.install
    endpoints = _render.endpoints(spec, host) if is_node else {}
    return {
        "is_node": is_node,
        "runs_coordinator": spec.p2p is not None and spec.p2p.coordinator.node == host,
        "venv": inst.venv,
        "requirements": [f"{inst.vllm_package}=={inst.vllm_version}", f"lmcache=={inst.lmcache_version}"]
        # Serving nodes load the P2P transfer engine; the coordinator does not.
        + ([spec.p2p.transfer_package] if spec.p2p is not None and is_node else []),
        "model_path": spec.model.path,
        "served_name": spec.model.served_name,
        "l2": None
        if spec.l2 is None
        else {
            "adapter": spec.l2.adapter,
            "host": spec.l2.host,
            "port": spec.l2.port,
            "user": spec.l2.user,
            "password_var": spec.l2.password_var,
        },
        "l3_path": None if spec.l3 is None else spec.l3.path,
        "p2p": spec.p2p is not None and is_node,
        "endpoints": endpoints,
        "fingerprint": _cluster.fingerprint(spec),
    }


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


def vllm_lmcache_installed(pip_list_json):
    """{normalized name: version} from `pip list --format json` output."""
    return {_normalize(p["name"]): p["version"] for p in pip_list_json}


def vllm_lmcache_missing(wanted, installed):
    """name==version for every wanted package that is absent or at another version."""
    return [f"{n}=={v}" for n, v in sorted(dict(wanted).items()) if dict(installed).get(n) != v]


class FilterModule:
    def filters(self):
        return {
            "vllm_lmcache_facts": vllm_lmcache_facts,
            "vllm_lmcache_lock": vllm_lmcache_lock,
            "vllm_lmcache_installed": vllm_lmcache_installed,
            "vllm_lmcache_missing": vllm_lmcache_missing,
        }
