"""Checks of variable names: a role-prefixed variable that no role declares is misspelt or was removed.

Ansible ignores an unknown variable, so `roce_mtus: 4096` silently leaves the MTU at its default. The names
a role declares come from its defaults/main.yml and meta/argument_specs.yml; names in its vars/main.yml are
internal (role vars win over the inventory, so setting them there has no effect).
"""

from __future__ import annotations

import difflib
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import yaml


@dataclass
class RoleVariables:
    """What the roles declare: name -> role for public names and for internal ones, and the defaults."""

    public: dict = field(default_factory=dict)
    internal: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)

    @property
    def prefixes(self) -> dict:
        """Role-name prefix ("roce_") -> role, for every role."""
        roles = set(self.public.values()) | set(self.internal.values())
        return {f"{role}_": role for role in roles}


def _load(path: pathlib.Path) -> dict:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}


def read_roles(roles_dir) -> RoleVariables:
    found = RoleVariables()
    for role_dir in sorted(pathlib.Path(roles_dir).iterdir()):
        if not (role_dir / "tasks").is_dir():
            continue
        role = role_dir.name
        defaults = _load(role_dir / "defaults" / "main.yml")
        found.defaults.update(defaults)
        for name in defaults:
            found.public[name] = role
        for entry in (_load(role_dir / "meta" / "argument_specs.yml").get("argument_specs") or {}).values():
            for name in (entry or {}).get("options") or {}:
                found.public.setdefault(name, role)
        for name in _load(role_dir / "vars" / "main.yml"):
            found.internal.setdefault(name, role)
        found.internal.setdefault(role, role)  # so the prefix is known even for a role without variables
    return found


def unknown_variables(host_names: Mapping, roles: RoleVariables, removed: Mapping | None = None) -> list:
    """`host_names`: host -> the names of its inventory variables. One message per unknown name."""
    removed = removed or {}
    prefixes = roles.prefixes
    seen: dict = {}  # name -> [hosts]
    for host, names in host_names.items():
        for name in names:
            name = str(name)
            if _role_of(name, prefixes) is None or name in roles.public:
                continue
            seen.setdefault(name, []).append(str(host))
    return [_message(name, hosts, roles, removed) for name, hosts in sorted(seen.items())]


def _role_of(name: str, prefixes: Mapping):
    """The role whose prefix the name has (the longest prefix wins), or None."""
    matches = [prefix for prefix in prefixes if name.startswith(prefix)]
    return prefixes[max(matches, key=len)] if matches else None


def _message(name: str, hosts: Iterable[str], roles: RoleVariables, removed: Mapping) -> str:
    where = f"{name} (set for {', '.join(hosts)})"
    if name in removed:
        return f"{where} was removed: {removed[name]}"
    if name in roles.internal:
        role = roles.internal[name]
        return (
            f"{where} is internal to role {role} (roles/{role}/vars/main.yml) and overrides nothing from the "
            f"inventory: remove it"
        )
    close = difflib.get_close_matches(name, list(roles.public), n=1, cutoff=0.75)
    role = _role_of(name, roles.prefixes)
    hint = f"did you mean {close[0]}?" if close else f"see roles/{role}/meta/argument_specs.yml for the known names"
    return f"{where} is not a variable of any kvtier role ({hint}): rename or remove it"
