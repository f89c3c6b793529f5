"""Assemble the spec dict from Ansible inventory data: one `kvtier_cluster`, per-node host vars.

Ansible resolves variables per host, so a `kvtier_cluster` defined again in a group or host scope could
silently give nodes different chunk sizes or endpoints. `cluster_from_hostvars()` therefore reads it from
every serving host and refuses any difference, naming the first differing setting. Nodes come from host
vars named ``kvtier_<field>`` (``kvtier_data_address`` and the other `spec.NODE_KEYS`); a host var that
names a cluster-wide setting (``kvtier_chunk_size`` ...) is refused too.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtier.cluster import derive
from kvtier.cluster.spec import CLUSTER_WIDE_KEYS, NODE_HINTS, NODE_KEYS, SpecError

CLUSTER_VAR = "kvtier_cluster"
# The Sparks playbooks/remove_spark.yml is taking out (a group it makes for its run): every rendering leaves them out.
REMOVING_GROUP = "kvtier_removing"
_SENSITIVE = ("pass", "secret", "token", "key")


def plain(value):
    """A deep copy made of dict/list/str/int/float/bool/None (Ansible hands over lazy, tagged containers)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def first_difference(a, b, path: str = ""):
    """(dotted path, a value, b value) of the first difference between two plain structures, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else key
            if key not in a or key not in b:
                return sub, a.get(key, "<unset>"), b.get(key, "<unset>")
            found = first_difference(a[key], b[key], sub)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if a == b and type(a) is type(b):
        return None
    return path, a, b


def _cluster_as_defined(hostvars, host: str, var: str):
    """The host's `var` as written in the inventory (untemplated when Ansible can give it so).

    Ansible templates another host's vars without the magic variables (``hostvars`` is undefined there), so a
    kvtier_cluster that refers to ``hostvars[...]`` cannot be templated through `hostvars`; comparing the raw
    definitions catches what matters: a second definition in a group or host scope.
    """
    raw_get = getattr(hostvars, "raw_get", None)
    variables = raw_get(host) if raw_get is not None else hostvars[host]
    return plain(variables[var]) if var in variables else None


def cluster_from_hostvars(cluster, hostvars, hosts, var: str = CLUSTER_VAR, storage_vars=None) -> dict:
    """The spec dict for the serving `hosts`: `cluster` (this host's templated `var`) plus ``nodes``.

    `storage_vars`: the storage node's variables (`derive.STORAGE_VARS`), from which the L2 endpoint is
    derived where `cluster` leaves it out; None when the inventory has no single storage node.

    Raise SpecError when a host lacks `var`, defines it differently, sets a cluster-wide value as a host
    var, or when `cluster` already has ``nodes``.
    """
    hosts = [str(h) for h in (hosts or [])]
    if not hosts:
        raise SpecError(["no serving hosts: the group of Spark nodes is empty or undefined"])
    problems: list = []
    cluster = plain(cluster)
    if not isinstance(cluster, dict):
        raise SpecError([f"{var} must be a mapping defined once in group_vars/all, not {type(cluster).__name__}"])
    if "nodes" in cluster:
        problems.append(
            f"{var}.nodes is built from the inventory: set each node's values as host vars "
            f"({', '.join('kvtier_' + k for k in NODE_KEYS)}) instead"
        )
    base, base_host, nodes = None, None, {}
    # P2P settings as written (the spec parser reports what is wrong with them); UCX derives only from a mapping.
    tiers, p2p = cluster.get("tiers"), cluster.get("p2p")
    p2p = p2p if isinstance(p2p, Mapping) and isinstance(tiers, list) and "l1_p2p" in tiers else None
    for host in hosts:
        if host not in hostvars:
            problems.append(f"host {host} is not in the inventory")
            continue
        defined = _cluster_as_defined(hostvars, host, var)
        if not isinstance(defined, dict):
            problems.append(f"host {host} has no {var} mapping: define {var} once in group_vars/all")
        elif base is None:
            base, base_host = defined, host
        else:
            diff = first_difference(base, defined)
            if diff:
                where, x, y = diff
                shown = "" if any(s in where.lower() for s in _SENSITIVE) else f" ({x!r} vs {y!r})"
                problems.append(
                    f"{var} differs between {base_host} and {host} at {where}{shown}: define it once "
                    f"(group_vars/all), never per group or per host"
                )
        hv = hostvars[host]
        for key in sorted(CLUSTER_WIDE_KEYS):
            if key not in NODE_KEYS and f"kvtier_{key}" in hv:
                problems.append(f"host {host}: kvtier_{key}: {NODE_HINTS[key]}")
        nodes[host] = {key: plain(hv[f"kvtier_{key}"]) for key in NODE_KEYS if f"kvtier_{key}" in hv}
        fabric = {name: plain(hv[name]) for name in derive.FABRIC_VARS if name in hv}
        for key, value in derive.ucx_fabric(fabric, p2p).items():
            nodes[host].setdefault(key, value)
    if problems:
        raise SpecError(problems)
    spec = derive.with_l2_endpoint(cluster, storage_vars)
    spec["nodes"] = nodes
    return spec


def storage_vars_of(hostvars, storage_hosts) -> dict | None:
    """The storage node's variables the spec derives L2 from (derive.STORAGE_VARS); None unless the inventory has
    exactly one storage node (preflight names that problem)."""
    hosts = [str(h) for h in storage_hosts or []]
    if len(hosts) != 1:
        return None
    variables = hostvars[hosts[0]]
    return {name: plain(variables[name]) for name in derive.STORAGE_VARS if name in variables}


def spec_dict_of_play(hostvars, groups, var: str = CLUSTER_VAR) -> dict:
    """The spec dict of the cluster a play sees (its `hostvars` and `groups`): the Sparks of group spark but those
    being removed, L2 derived from the storage node. Raises KeyError when a Spark lacks `var`, SpecError on a bad
    spec."""
    groups = plain(groups)
    removing = {str(h) for h in groups.get(REMOVING_GROUP) or []}
    spark = [str(h) for h in groups.get("spark") or [] if str(h) not in removing]
    cluster = plain(hostvars[spark[0]][var]) if spark else None
    return cluster_from_hostvars(cluster, hostvars, spark, var, storage_vars_of(hostvars, groups.get("storage")))
