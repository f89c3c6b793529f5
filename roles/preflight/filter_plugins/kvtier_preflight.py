"""Jinja2 filters for the preflight role: gather inventory data, call kvtier.preflight, return problems.

    "{{ ansible_version.full | kvtier_preflight_controller(settings) }}"          # [] when fine
    "{{ hostvars | kvtier_preflight_inventory(groups, settings) }}"
    "{{ hostvars | kvtier_preflight_credentials(groups, settings) }}"            # use with no_log
    "{{ ansible_facts.kvtier_nvme.drives | kvtier_preflight_drives(inventory_hostname, count, pattern, serials) }}"
    "{{ memtotal_mb | kvtier_preflight_memory(hostvars, groups.spark, inventory_hostname, groups.storage) }}"
    "{{ free_mb | kvtier_preflight_free_memory(ps_rss, hostvars, groups.spark, inventory_hostname, groups.storage) }}"
    "{{ ansible_facts.interfaces | kvtier_preflight_nic(inventory_hostname, roce_interface) }}"
    "{{ probe_stdout | kvtier_preflight_rdma_stack(inventory_hostname) }}"        # key=value lines

The logic lives in kvtier.preflight and works on plain dicts; this file only reads Ansible's objects.
Each filter returns a list of messages that name hosts and variables, never a secret's value.
"""

from __future__ import annotations

import getpass
import importlib
import importlib.util
import json
import pathlib
import sys

try:
    from kvtier import preflight as _preflight  # noqa: F401  (the package must import)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kvtier.cluster import derive
from kvtier.cluster.inventory import plain
from kvtier.preflight import accounts, controller, credentials, groups, hardware, network, tiers, varnames

# Host variables the network and tier checks read (with the roles' defaults filled in).
_NETWORK_VARS = (
    "kvtier_data_address",
    "roce_address",
    "roce_interface",
    "roce_mtu",
    "nfs_client_server",
    "nfs_client_mount_point",
    "kv_store_port",
    "kv_store_lmcache_user",
)


def _raw(hostvars, host):
    raw_get = getattr(hostvars, "raw_get", None)
    return raw_get(host) if raw_get is not None else hostvars[host]


def _value(hostvars, host, name, problems, secret=False):
    """The host's templated variable, or None when unset; a templating error becomes a problem."""
    if name not in _raw(hostvars, host):
        return None
    try:
        return plain(hostvars[host][name])
    except Exception as exc:  # any templating error: report it, keep checking the rest
        detail = type(exc).__name__ if secret else str(exc).splitlines()[0]
        problems.append(
            f"host {host}: {name} could not be evaluated ({detail}); is the vault password given?"
            if secret
            else f"host {host}: {name} could not be evaluated: {detail}"
        )
        return None


def _view(hostvars, host, names, defaults, problems):
    # A default that is a template derives from other variables (nfs_client_server from the storage node):
    # it is right by construction, so only what the operator sets is checked.
    view = {name: defaults[name] for name in names if name in defaults and "{{" not in str(defaults[name])}
    for name in names:
        value = _value(hostvars, host, name, problems)
        if value is not None:
            view[name] = value
    return view


def _hosts(groups_, settings):
    storage = [str(h) for h in groups_.get(settings["storage_group"]) or []]
    spark = [str(h) for h in groups_.get(settings["spark_group"]) or []]
    return storage, spark


def _storage_vars(hostvars, storage, problems):
    """The storage node's variables the spec derives from (None without exactly one storage node)."""
    if len(storage) != 1:
        return None
    found = {name: _value(hostvars, storage[0], name, problems) for name in derive.STORAGE_VARS}
    return {name: value for name, value in found.items() if value is not None}


def _cluster(hostvars, spark, problems):
    """kvtier_cluster as the first Spark sees it (it is defined once for all hosts)."""
    return _value(hostvars, spark[0], tiers.CLUSTER_VAR, problems) if spark else None


def _login_user(hostvars, host, problems):
    """(user, where it comes from): the account Ansible logs in to `host` with, as ansible-playbook decides it."""
    for name in ("ansible_user", "ansible_ssh_user"):
        user = _value(hostvars, host, name, problems)
        if user:
            return str(user), name
    try:
        from ansible import constants

        user = constants.config.get_config_value("DEFAULT_REMOTE_USER")
    except Exception:  # outside Ansible (unit tests): no configuration to read
        user = None
    if user:
        return str(user), "remote_user in the Ansible configuration"
    return getpass.getuser(), "the controller's user, as ansible_user is unset"


def _account_problems(hostvars, spark, roles, problems):
    service = {host: _value(hostvars, host, accounts.SERVICE_USER_VAR, problems) for host in spark}
    default = roles.defaults.get(accounts.SERVICE_USER_VAR)
    service = {host: str(name if name is not None else default) for host, name in service.items()}
    login = {host: _login_user(hostvars, host, problems) for host in spark}
    return accounts.login_user_problems(login, service)


def _collection_version(name):
    """The installed version of a collection as Ansible's loader finds it; None if missing, "" if unknown."""
    try:
        package = importlib.import_module(f"ansible_collections.{name}")
    except ImportError:
        return None
    for path in getattr(package, "__path__", []):
        manifest = pathlib.Path(path) / "MANIFEST.json"
        if manifest.is_file():
            return json.loads(manifest.read_text())["collection_info"]["version"]
    return ""


def kvtier_preflight_controller(ansible_version, settings):
    requirements = plain(settings["requirements"]) or []
    installed = {str(r["name"]): _collection_version(str(r["name"])) for r in requirements}
    importable = {str(name): importlib.util.find_spec(str(name)) is not None for name in settings["libraries"]}
    return (
        controller.ansible_version(str(ansible_version), str(settings["ansible_min"]), str(settings["ansible_max"]))
        + controller.collections(requirements, installed)
        + controller.python_libraries(importable, sys.executable)
    )


def kvtier_preflight_inventory(hostvars, groups_, settings):
    settings = plain(settings)
    problems = groups.groups(
        plain(groups_), settings["storage_group"], settings["spark_group"], int(settings["min_spark"])
    )
    storage, spark = _hosts(groups_, settings)
    roles = varnames.read_roles(settings["roles_dir"])
    views = {host: _view(hostvars, host, _NETWORK_VARS, roles.defaults, problems) for host in storage + spark}
    storage_host = storage[0] if len(storage) == 1 else None
    problems += network.addresses(views, storage_host, settings.get("data_cidr") or "")
    problems += network.mtu(views)
    storage_vars = _storage_vars(hostvars, storage, problems)
    spec_dict, spec_problems = tiers.spec_problems(_cluster(hostvars, spark, problems), hostvars, spark, storage_vars)
    problems += spec_problems
    if spec_dict is not None:
        problems += tiers.storage_agreement(
            spec_dict, storage_host, views.get(storage_host, {}), {h: views[h] for h in spark}
        )
    problems += _account_problems(hostvars, spark, roles, problems)
    names = {str(host): list(_raw(hostvars, host)) for host in groups_.get("all", [])}
    problems += varnames.unknown_variables(names, roles, settings.get("removed_variables") or {})
    return problems


def kvtier_preflight_credentials(hostvars, groups_, settings):
    settings = plain(settings)
    storage, spark = _hosts(groups_, settings)
    problems, values = [], []
    for host in storage:
        for name in settings["credential_vars"]:
            values.append((host, name, _value(hostvars, host, name, problems, secret=True)))
    cluster = _cluster(hostvars, spark, []) if spark else None
    password_var = ((cluster or {}).get("l2") or {}).get("password_var") if isinstance(cluster, dict) else None
    uses_l2 = isinstance(cluster, dict) and "l2" in (cluster.get("tiers") or [])
    clients = []
    if uses_l2 and isinstance(password_var, str) and password_var:
        clients = [(host, password_var, _value(hostvars, host, password_var, problems, secret=True)) for host in spark]
    own = [
        (host, name, _value(hostvars, host, name, problems, secret=True))
        for host in spark
        for name in settings.get("spark_credential_vars") or []
    ]
    problems += credentials.credentials(values + clients + own)
    server = next((v for v in values if v[1] == settings["l2_server_var"]), None)
    if server is not None:
        problems += credentials.same_secret(server, clients)
    admin = settings.get("l2_admin_var")
    if admin:
        problems += credentials.distinct_secrets(values, settings["l2_server_var"], admin)
    return problems


def kvtier_preflight_drives(drives, host, count, pattern, serials=()):
    return hardware.storage_drives(str(host), plain(drives) or [], int(count), str(pattern), plain(serials) or [])


def _spec_dict(hostvars, spark, storage):
    """(spec dict or None, problems) as the inventory checks read it."""
    problems = []
    spark, storage = [str(h) for h in spark or []], [str(h) for h in storage or []]
    storage_vars = _storage_vars(hostvars, storage, problems)
    spec_dict, spec_problems = tiers.spec_problems(_cluster(hostvars, spark, problems), hostvars, spark, storage_vars)
    return spec_dict, problems + spec_problems


def kvtier_preflight_memory(memtotal_mb, hostvars, spark, host, storage=()):
    spec_dict, problems = _spec_dict(hostvars, spark, storage)
    if spec_dict is None:  # the inventory checks already reported why
        return problems
    return hardware.spark_memory(str(host), memtotal_mb, spec_dict)


def kvtier_preflight_free_memory(available_mb, rss_text, hostvars, spark, host, storage=()):
    """`rss_text`: `ps -o rss=` of the service user's processes (KiB a line; empty when it has none)."""
    spec_dict, problems = _spec_dict(hostvars, spark, storage)
    if spec_dict is None:
        return problems
    held_kb = sum(int(word) for word in str(rss_text or "").split() if word.isdigit())
    return hardware.spark_free_memory(str(host), available_mb, held_kb, spec_dict)


def kvtier_preflight_nic(interfaces, host, roce_interface):
    return hardware.nic(str(host), plain(interfaces) or [], str(roce_interface or ""))


def kvtier_preflight_rdma_stack(text, host):
    """Problems of the RDMA stack from the probe's key=value lines (ofed, mlx_compat, rpcrdma)."""
    stack = dict(line.split("=", 1) for line in str(text or "").splitlines() if "=" in line)
    return hardware.rdma_stack(str(host), stack)


class FilterModule:
    def filters(self):
        return {
            "kvtier_preflight_controller": kvtier_preflight_controller,
            "kvtier_preflight_inventory": kvtier_preflight_inventory,
            "kvtier_preflight_credentials": kvtier_preflight_credentials,
            "kvtier_preflight_drives": kvtier_preflight_drives,
            "kvtier_preflight_memory": kvtier_preflight_memory,
            "kvtier_preflight_free_memory": kvtier_preflight_free_memory,
            "kvtier_preflight_nic": kvtier_preflight_nic,
            "kvtier_preflight_rdma_stack": kvtier_preflight_rdma_stack,
        }
