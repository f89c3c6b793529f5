"""The router's backends from the cluster spec, and its tenants (controller side).

    backends: "{{ kvtier_cluster | router_backends(hostvars, groups['spark'], groups['storage'] | default([])) }}"
    problems: "{{ router_tenants | router_credential_problems(router_cache_salt_secret, secrets) }}"  # names only
    content: "{{ router_tenants | router_tenant_map(router_cache_salt_secret) }}"                     # no_log

The Sparks, their addresses and vLLM ports come from kvtier.cluster, the same spec every other role renders
from, so the router cannot point at a port or address the Sparks do not use.
"""

from __future__ import annotations

import pathlib
import re
import sys

from ansible.errors import AnsibleFilterError

try:
    import kvtier  # noqa: F401  (the package must import)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kvtier import cluster, passwords
from kvtier.cluster import render
from kvtier.cluster.inventory import plain, storage_vars_of
from kvtier.cluster.tenants import salt as tenant_salt


def router_backends(cluster_var, hostvars, spark_hosts, storage_hosts=()):
    """[{name, address, port}] for every Spark, in the spec's order."""
    storage_vars = storage_vars_of(hostvars, storage_hosts)
    try:
        spec_dict = cluster.cluster_from_hostvars(cluster_var, hostvars, spark_hosts, "kvtier_cluster", storage_vars)
        return render.router_backends(cluster.load_spec(spec_dict))
    except (cluster.SpecError, render.RenderError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from None


_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def router_credential_problems(tenants, salt_secret, others=None):
    """Why the tenants and the router's secrets cannot be used, one line each, naming variables, never values.
    `others`: {variable name: value} of the router's other secrets (the vLLM key, the statistics password)."""
    tenants = plain(tenants) or []
    problems = [] if tenants else ["router_tenants is empty: give at least one tenant {name, api_key} (vaulted key)"]
    names, keys = set(), {}
    for index, tenant in enumerate(tenants):
        if not isinstance(tenant, dict):
            problems.append(f"router_tenants[{index}] is not a mapping of name and api_key")
            continue
        name = str(tenant.get("name") or "")
        if not _TENANT_NAME.match(name):
            problems.append(f"router_tenants[{index}].name must be letters, digits, '.', '_', '-' (up to 63)")
        elif name in names:
            problems.append(f"router_tenants: the tenant {name} is listed twice")
        names.add(name)
        problems += passwords.problems(tenant.get("api_key"), f"router_tenants[{index}].api_key ({name})")
        key = str(tenant.get("api_key") or "")
        if key.startswith("#"):
            problems.append(
                f"router_tenants[{index}].api_key ({name}) starts with '#', which HAProxy's map reads as a comment"
            )
        if key and key in keys:
            problems.append(
                f"router_tenants: {keys[key]} and {name} have the same key (one tenant could not be told apart)"
            )
        keys.setdefault(key, name)
    problems += passwords.problems(salt_secret, "router_cache_salt_secret")
    for variable, value in sorted((plain(others) or {}).items()):
        problems += passwords.problems(value, variable)
        if value and str(value) in keys:
            problems.append(f"{variable} is also a tenant's key: give it a value of its own")
    return problems


def kvtier_env_quote(value) -> str:
    """`value` for the inside of a double-quoted value in a systemd EnvironmentFile."""
    text = str(value)
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return text


def router_tenant_map(tenants, salt_secret) -> str:
    """HAProxy's map of the tenants: each key, then that tenant's cache salt (a secret: keep it out of logs)."""
    lines = [f"{t['api_key']} {tenant_salt(salt_secret, t['name'])}" for t in plain(tenants) or []]
    return "\n".join(lines) + "\n"


class FilterModule:
    def filters(self):
        return {
            "router_backends": router_backends,
            "router_credential_problems": router_credential_problems,
            "router_tenant_map": router_tenant_map,
            "kvtier_env_quote": kvtier_env_quote,
        }
