"""No secret in any log: after the lab's runs, every node's journal since boot (every unit's lines, sudo's COMMAND=
lines, Ansible's module invocations) is read to this host and searched here for every secret value the lab holds,
and the passwords derived from them that the nodes use. The values never travel to a node, so the search cannot leak
them itself."""

from __future__ import annotations

from kvtier import passwords as l2_logins
from kvtier.lab import credentials
from kvtier.lab.stages import StageFailed
from kvtier.nodes import transport as nodes

# journalctl of a whole boot, message text only: what a reader of the node's logs sees.
JOURNAL = ("journalctl", "--boot", "--output", "cat", "--no-pager")


def secret_values(values: dict, sparks: list, l2_user: str) -> dict:
    """Every value to look for, by a name that says what it is: the lab's secrets and each Spark's L2 password
    (derived from the L2 secret). A tenant's cache salt is not among them: it names the tenant's entries and grants
    nothing without vLLM's key (the router sets it; only holders of that key may send their own), and LMCache itself
    writes it into its warnings (a failed store's keys) and its metrics (the cache_salt label)."""
    found = {name: value for name, value in values.items() if value}
    for spark in sparks:
        user, password = l2_logins.node_login(l2_user, spark, values["kv_store_lmcache_password"])
        found[f"L2 password of {user}"] = password
    return found


def leaks(journal: str, values: dict) -> list:
    """(secret's name, the line) for each journal line that carries a secret value."""
    return [(name, line) for line in journal.splitlines() for name, value in values.items() if value in line]


def run(out, t, vm, l2_user: str, others: dict | None = None) -> str:
    """Search the journals of the Sparks (t.nodes), of the storage VM and of `others` ({name: a callable that returns
    its journal}: the operations host, whose health timer runs the repair playbook); fail naming each line that
    leaks."""
    values = secret_values(credentials.passwords(credentials.STATE), list(t.nodes), l2_user)
    journals = {}
    for name, node in t.nodes.items():
        try:
            journals[name] = node.run(*JOURNAL, timeout=120)
        except nodes.NodeError as exc:
            raise StageFailed(f"{name}: its journal was not read: {exc}") from None
    journals[vm.name] = vm.ssh(" ".join(JOURNAL), timeout=120).stdout
    journals.update({name: read() for name, read in (others or {}).items()})
    found = [(host, name, line) for host, journal in journals.items() for name, line in leaks(journal, values)]
    for host, name, line in found[:10]:
        out(f"  {host}: the {name} in: {line[:200]}")
    if found:
        raise StageFailed(f"{len(found)} journal line(s) carry a secret value (above)")
    lines = sum(len(j.splitlines()) for j in journals.values())
    sudo = sum(j.count("COMMAND=") for j in journals.values())
    return (
        f"no secret in {lines} journal lines of {len(journals)} nodes ({sudo} sudo commands), "
        f"{len(values)} values searched"
    )
