"""How the controller runs a command on a cluster node: the same transport Ansible uses for that host.

The tier proof reads LMCache's HTTP API, which listens on the node's loopback only (it has no
authentication), so every probe runs on the node itself: a standard-library Python snippet fed to the
node's ``python3`` on stdin. A node is reached the way the inventory says Ansible reaches it: ``podman exec``
for the lab's Spark containers, ``ssh`` (with the inventory's user, port, key and common arguments) otherwise.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping

PODMAN_CONNECTIONS = ("containers.podman.podman", "podman")


class NodeError(Exception):
    """A command on a node failed or could not be run; the message names the node and the command."""


class Node:
    """One host: `run()` a command there, `python()` a snippet there."""

    def __init__(
        self, name: str, prefix: list, *, remote_shell: bool = False, become: bool = False, become_user: str = ""
    ):
        self.name = name
        self._prefix = list(prefix)
        self._remote_shell = remote_shell  # ssh hands the command to a shell: quote every word
        self._become = become
        self._become_user = become_user

    def argv(self, *command: str) -> list:
        sudo = ["sudo", "-n"] + (["-u", self._become_user] if self._become_user else [])
        command = (sudo if self._become else []) + list(command)
        if self._remote_shell:
            return self._prefix + [shlex.join(command)]
        return self._prefix + command

    def run(self, *command: str, stdin: str | None = None, timeout: float = 600) -> str:
        """stdout of `command` on the node; NodeError when it fails."""
        try:
            proc = subprocess.run(self.argv(*command), input=stdin, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NodeError(f"{self.name}: {' '.join(command)}: {exc}") from None
        if proc.returncode != 0:
            raise NodeError(
                f"{self.name}: {' '.join(command)}: {proc.stderr.strip()[-2000:] or f'exit {proc.returncode}'}"
            )
        return proc.stdout

    def python(self, script: str, expression: str, timeout: float = 600):
        """Evaluate `expression` after `script` (standard-library Python, see kvtier.nodes.scripts) on the node;
        its JSON-decoded result."""
        text = f"{script}\nimport json as _json\nprint(_json.dumps({expression}))\n"
        return json.loads(self.run("python3", "-", stdin=text, timeout=timeout))

    def __repr__(self) -> str:
        return f"Node({self.name!r})"


def podman(name: str, container: str) -> Node:
    return Node(name, ["podman", "exec", "-i", container])


def ssh(
    name: str,
    host: str,
    user: str | None = None,
    port=None,
    key: str | None = None,
    extra: str = "",
    become: bool = False,
    become_user: str = "",
) -> Node:
    prefix = ["ssh", "-o", "BatchMode=yes"] + shlex.split(extra or "")
    if port:
        prefix += ["-p", str(port)]
    if key:
        prefix += ["-i", key]
    prefix.append(f"{user}@{host}" if user else host)
    return Node(name, prefix, remote_shell=True, become=become, become_user=become_user)


def local(name: str) -> Node:
    return Node(name, [])


def from_hostvars(name: str, hostvars: Mapping) -> Node:
    """The Node for an inventory host, from its connection variables (as Ansible would connect)."""
    connection = str(hostvars.get("ansible_connection") or "ssh")
    address = str(hostvars.get("ansible_host") or name)
    if connection in PODMAN_CONNECTIONS:
        return podman(name, address)
    if connection == "local":
        return local(name)
    if connection not in ("ssh", "ansible.builtin.ssh", "paramiko", "ansible.builtin.paramiko_ssh", "smart"):
        raise NodeError(
            f"{name}: ansible_connection {connection!r} is not supported by kvtier's probes (ssh, local and podman are)"
        )
    extra = " ".join(str(hostvars[k]) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args") if hostvars.get(k))
    become = str(hostvars.get("ansible_become", False)).lower() in ("true", "yes", "1")
    if become:
        _check_become(name, hostvars)
    return ssh(
        name,
        address,
        hostvars.get("ansible_user"),
        hostvars.get("ansible_port"),
        hostvars.get("ansible_ssh_private_key_file") or hostvars.get("ansible_private_key_file"),
        extra,
        become=become,
        become_user=""
        if str(hostvars.get("ansible_become_user") or "root") == "root"
        else hostvars["ansible_become_user"],
    )


def _check_become(name: str, hostvars: Mapping) -> None:
    """kvtier's probes become root with `sudo -n`: refuse, before any command, what that cannot honour."""
    method = str(hostvars.get("ansible_become_method") or "sudo")
    if method not in ("sudo", "ansible.builtin.sudo"):
        raise NodeError(
            f"{name}: ansible_become_method {method!r}: kvtier's probes become root with sudo only; "
            "give the login user sudo, or run the playbook form of the command (playbooks/health.yml)"
        )
    if hostvars.get("ansible_become_password") or hostvars.get("ansible_become_pass"):
        raise NodeError(
            f"{name}: a become password is set: kvtier's probes run `sudo -n` and never type a password; "
            "allow the login user passwordless sudo, or run the playbook form of the command (playbooks/health.yml)"
        )
