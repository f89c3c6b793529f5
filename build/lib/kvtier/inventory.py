"""Read an Ansible inventory as ansible-playbook sees it: groups, and each host's variables templated.

The CLI verbs that act on a running cluster (`kvtier prove`) take the same inventory as site.yml, so that
the ports, model, tiers and credentials they use are the ones the cluster was provisioned with. Vaulted
values need the vault password (``--vault-password-file``, or ANSIBLE_VAULT_PASSWORD_FILE).
"""

from __future__ import annotations

import os
import pathlib

from kvtier.cluster.inventory import plain


class InventoryError(Exception):
    pass


class Inventory:
    def __init__(self, path, vault_password_file: str | None = None):
        # Ansible's API is imported here: `kvtier images` and the unit tests of other modules stay light.
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        self.path = pathlib.Path(path)
        if not self.path.exists():
            raise InventoryError(f"inventory {self.path} does not exist")
        self._error = AnsibleError
        self._loader = DataLoader()
        vault_file = vault_password_file or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
        if vault_file:
            from ansible.cli import CLI

            self._loader.set_vault_secrets(
                CLI.setup_vault_secrets(self._loader, vault_ids=[], vault_password_files=[vault_file])
            )
        try:
            self._inventory = InventoryManager(loader=self._loader, sources=[str(self.path)])
        except AnsibleError as exc:
            raise InventoryError(f"inventory {self.path}: {exc}") from None
        self._variables = VariableManager(loader=self._loader, inventory=self._inventory)

    def group(self, name: str) -> list:
        """Host names in a group, in inventory order ([] when the group does not exist)."""
        hosts = self._inventory.get_groups_dict().get(name, [])
        return list(hosts)

    def hostvars(self, host: str, *names: str) -> dict:
        """The named variables of `host` (all when none are named), templated; missing ones are left out."""
        from ansible.template import Templar

        found = self._inventory.get_host(host)
        if found is None:
            raise InventoryError(f"host {host} is not in the inventory {self.path}")
        variables = self._variables.get_vars(host=found)
        templar = Templar(loader=self._loader, variables=variables)
        wanted = names or tuple(variables)
        out = {}
        for name in wanted:
            if name not in variables:
                continue
            try:
                out[name] = plain(templar.template(variables[name]))
            except self._error as exc:
                raise InventoryError(f"{host}: {name} cannot be templated: {exc}") from None
        return out
