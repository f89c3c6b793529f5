"""Make library/ modules importable in unit tests.

Modules import their shared code as ``ansible.module_utils.kvtier_<name>``; in production Ansible ships
module_utils/kvtier_<name>.py (a symlink to kvtier/probes/<name>.py) with the module. Here the same
source is registered under that name, so tests exercise exactly the code that runs on targets.
"""

import importlib
import pathlib
import sys

import ansible.module_utils

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _alias_module_utils():
    for link in (ROOT / "module_utils").glob("kvtier_*.py"):
        probe = link.resolve().stem
        mod = importlib.import_module(f"kvtier.probes.{probe}")
        sys.modules[f"ansible.module_utils.{link.stem}"] = mod
        setattr(ansible.module_utils, link.stem, mod)


_alias_module_utils()
sys.path.insert(0, str(ROOT / "library"))
