"""Mitogen's strategy for test runs on QEMU/TCG guests, where stock Ansible pays for Python per task.

Stock Ansible starts a Python interpreter and unpacks the module's code for every task; on a TCG guest that is
8-9 s of guest CPU (a no-op `ping`: 9.0 s, measured). Mitogen's linear strategy runs the same plays, tasks and
modules through one interpreter per host for the whole run: a simple task then takes under a second, but its
start costs ~30 s per playbook in a TCG guest. The lab and `make test`'s MITOGEN_SCENARIOS use it; the other
role scenarios and real clusters run stock Ansible.

`python -m kvtier.lab.strategy` prints the environment as shell exports (for `make molecule`).
"""

from __future__ import annotations

import os
import pathlib
import shlex

from kvtier import runner


def strategy_env() -> dict:
    """The environment that selects Mitogen's strategy ({} where KVTIER_LAB_MITOGEN=0 or it is not installed)."""
    if os.environ.get("KVTIER_LAB_MITOGEN", "1") == "0":
        return {}
    try:
        import ansible_mitogen
    except ImportError:
        return {}
    return {
        "ANSIBLE_STRATEGY_PLUGINS": str(pathlib.Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"),
        "ANSIBLE_STRATEGY": "mitogen_linear",
        # Every test host is new (its inventory already tells ssh not to pin host keys); Mitogen decides host-key
        # checking from this setting rather than from the inventory's ssh arguments.
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        # Mitogen starts its interpreter within the connection timeout: in a TCG guest on a busy host that took
        # over 10 s (Ansible's default), and the run failed with "Connection timed out".
        "ANSIBLE_TIMEOUT": "120",
    }


def run_playbook(*args, **kwargs):
    """kvtier.runner.run_playbook under the lab's strategy: the lab's own playbook runs ask for it here."""
    return runner.run_playbook(*args, env={**strategy_env(), **(kwargs.pop("env", None) or {})}, **kwargs)


if __name__ == "__main__":
    for key, value in strategy_env().items():
        print(f"export {key}={shlex.quote(value)}")
