"""Checks of the controller: the ansible-core version, the collections and the Python libraries the roles use."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_INSTALL_HINT = "install the pinned set with `pip install -r requirements.lock`"


def version_tuple(version: str) -> tuple:
    """The leading numeric release of a version string ("2.20.0rc1" -> (2, 20, 0))."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version))
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _at_least(version: str, minimum: str) -> bool:
    have, need = version_tuple(version), version_tuple(minimum)
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def ansible_version(version: str, minimum: str, maximum: str) -> list:
    """ansible-core must be >= minimum and < maximum (exclusive, like kubespray's range)."""
    if _at_least(version, minimum) and not _at_least(version, maximum):
        return []
    return [
        f"ansible-core {version} is not supported: kvtier needs >= {minimum} and < {maximum} "
        f"(preflight_ansible_min, preflight_ansible_max); {_INSTALL_HINT}"
    ]


def collections(required: Iterable[Mapping], installed: Mapping) -> list:
    """Every collection of requirements.yml must be installed at its pinned version or newer.

    `required`: requirements.yml's ``collections`` entries ({name, version}); `installed`: name -> the
    installed version, or None when Ansible cannot find it.
    """
    problems = []
    for entry in required:
        name, pinned = str(entry["name"]), entry.get("version")
        have = installed.get(name)
        if have is None:
            problems.append(
                f"collection {name} is not installed (requirements.yml pins {pinned}): "
                f"run `ansible-galaxy collection install -r requirements.yml`"
            )
        elif pinned and not _at_least(str(have), str(pinned)):
            problems.append(
                f"collection {name} {have} is older than {pinned} (requirements.yml): "
                f"run `ansible-galaxy collection install -r requirements.yml --upgrade`"
            )
    return problems


def python_libraries(importable: Mapping, interpreter: str) -> list:
    """Every library the controller-side filters need must import in the Python that runs Ansible."""
    return [
        f"Python library {name} is not importable by the controller's Python ({interpreter}), which "
        f"runs ansible-playbook: install it there (`{interpreter} -m pip install {name}`) or {_INSTALL_HINT}"
        for name, ok in importable.items()
        if not ok
    ]
