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


def distinct_secrets(values: Iterable[tuple], first: str, second: str) -> list:
    """On each host, the variables `first` and `second` must not hold the same password: the L2 admin account
    (ACL changes, FLUSHALL) must not be reachable with the password every serving node holds."""
    by_host: dict = {}
    for host, name, value in values:
        # A value the policy refuses (an example placeholder) is reported as that already.
        if name in (first, second) and value not in (None, "") and not passwords.problem(value):
            by_host.setdefault(host, {})[name] = str(value)
    return [
        f"host {host}: {first} and {second} are the same password: whoever holds LMCache's (every Spark does) "
        f"could administer L2; give {second} a password of its own"
        for host, found in sorted(by_host.items())
        if len(found) == 2 and found[first] == found[second]
    ]
