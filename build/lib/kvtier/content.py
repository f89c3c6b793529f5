"""Where kvtier's Ansible content lives: playbooks/, roles/, library/, module_utils/ and ansible.cfg.

From a checkout, the checkout itself. From a controller install (`pip install` of the project, no checkout
needed), <prefix>/share/kvtier, where setup.py installs the same files: the venv's prefix, or the user's base for a
`pip install --user`.
"""

from __future__ import annotations

import functools
import pathlib
import site
import sys

_CHECKOUT = pathlib.Path(__file__).resolve().parents[1]


class ContentMissing(Exception):
    """Neither a checkout nor an install holds kvtier's playbooks and roles."""


def candidates() -> list:
    return [
        _CHECKOUT,
        pathlib.Path(sys.prefix) / "share" / "kvtier",
        pathlib.Path(site.getuserbase()) / "share" / "kvtier",
    ]


@functools.lru_cache(maxsize=1)
def root() -> pathlib.Path:
    """The first candidate that holds playbooks/site.yml and roles/."""
    for place in candidates():
        if (place / "playbooks" / "site.yml").is_file() and (place / "roles").is_dir():
            return place
    raise ContentMissing(
        "kvtier's playbooks and roles are in none of "
        + ", ".join(str(p) for p in candidates())
        + ": install kvtier with pip (it installs them under <prefix>/share/kvtier) or run it from a checkout"
    )
