"""The health timer's ExecStart, from the CLI's own definition of the command (kvtier.health.cli.command).

ExecStart={{ health_timer_kvtier | health_timer_exec(inventory, textfile, canary, vault_password_file, repair) }}
"""

from __future__ import annotations

import pathlib
import sys

from ansible.errors import AnsibleFilterError

try:
    import kvtier  # noqa: F401  (the package must import)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kvtier.cluster import systemd
from kvtier.health import cli


def health_timer_exec(kvtier, inventory, textfile, canary=False, vault_password_file="", repair=False):
    argv = cli.command(
        str(kvtier), str(inventory), str(textfile), bool(canary), str(vault_password_file or ""), bool(repair)
    )
    try:
        return systemd.exec_line(argv)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"health_timer_exec": health_timer_exec}
