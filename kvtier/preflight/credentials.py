"""Checks of the credentials across the inventory: each passes the password policy, and copies agree.

Callers pass values; messages carry only variable and host names, never a value, so they can be printed.
The policy itself is `kvtier.passwords`.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvtier import passwords


def credentials(values: Iterable[tuple]) -> list:
    """`values`: (host, variable name, value) for every credential a host uses."""
    found: dict = {}
    for host, name, value in values:
        problem = passwords.problem(value)
        if problem:
            found.setdefault((name, problem), []).append(host)
    return [f"{name} {problem} (hosts: {', '.join(hosts)})" for (name, problem), hosts in found.items()]


def same_secret(reference: tuple, others: Iterable[tuple]) -> list:
    """Each (host, name, value) of `others` must equal `reference` (host, name, value): a client's password copy."""
    ref_host, ref_name, ref_value = reference
    if ref_value in (None, ""):
        return []
    return [
        f"host {host}: {name} differs from {ref_name} on {ref_host}: LMCache on {host} would fail to log in to L2; "
        f"point kvtier_cluster.l2.password_var at the same vaulted value"
        for host, name, value in others
        if value not in (None, "") and str(value) != str(ref_value)
    ]
