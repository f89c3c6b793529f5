"""What every `kvtier` command shares: its exit statuses and the inventory it reads when `-i` is not given.

Statuses: 0 all good, 1 a check, proof or run failed, 2 bad usage or input (nothing was touched), 3 refused
without the operator's consent (a flag such as --disruptive gives it).
"""

from __future__ import annotations

import os

OK = 0
FAILED = 1
BAD_INPUT = 2
REFUSED = 3


class NoInventory(Exception):
    """No -i, and Ansible's configuration names no inventory that exists."""


def add_inventory_argument(parser) -> None:
    parser.add_argument(
        "-i",
        "--inventory",
        help="the inventory the cluster was provisioned with (default: Ansible's: ANSIBLE_INVENTORY, ansible.cfg)",
    )


def inventory(given: str | None) -> str:
    """`given`, or the inventory ansible-playbook would read: ANSIBLE_INVENTORY, then ansible.cfg's `inventory`
    (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg), then /etc/ansible/hosts."""
    if given:
        return given
    from ansible import constants  # Ansible's configuration, found and read as ansible-playbook reads it

    sources = [s for s in constants.DEFAULT_HOST_LIST or [] if s]
    for source in sources:
        if os.path.exists(source):
            return source
    raise NoInventory(
        "no inventory: pass -i, or name one in ANSIBLE_INVENTORY or ansible.cfg (Ansible's configuration names "
        + (", ".join(sources) if sources else "none")
        + ")"
    )
