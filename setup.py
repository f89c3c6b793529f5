"""kvtier's Ansible content (playbooks, roles, modules, ansible.cfg, the example inventory) is installed under
<prefix>/share/kvtier beside the package, so a controller install finds it without a checkout (kvtier/content.py).
Everything else about the package is in pyproject.toml."""

import os

from setuptools import setup

# What ansible-playbook needs from kvtier, relative to the checkout (module_utils' symlinks are installed as files).
CONTENT = ("ansible.cfg", "requirements.yml", "playbooks", "roles", "library", "module_utils", "inventory/example")


def data_files(root: str = os.path.dirname(os.path.abspath(__file__))) -> list:
    """[(share/kvtier/<dir>, [files])] for every file of CONTENT, caches left out."""
    found: dict = {}
    for entry in CONTENT:
        path = os.path.join(root, entry)
        if os.path.isfile(path):
            found.setdefault(os.path.dirname(entry), []).append(entry)
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            relative = os.path.relpath(folder, root)
            found.setdefault(relative, []).extend(os.path.join(relative, f) for f in sorted(files))
    return [(os.path.join("share", "kvtier", d).rstrip("/"), f) for d, f in sorted(found.items()) if f]


setup(data_files=data_files())
