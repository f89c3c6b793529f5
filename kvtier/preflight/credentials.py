"""Checks of the credentials: present, strong enough, not the example ones, and the same where they must be.

Callers pass values; messages carry only variable and host names, never a value, so they can be printed.
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_LENGTH = 16


def _problem(value, examples: Iterable[str], min_length: int) -> str | None:
    if value is None or str(value) == "":
        return "is not set: define it in a vault (see inventory/example/group_vars/all/vault.yml)"
    text = str(value)
    if text.lower() in {str(e).lower() for e in examples}:
        return "still has an example value: replace it with a generated one (openssl rand -base64 32) in a vault"
    if len(text) < min_length:
        return f"is shorter than {min_length} characters: use a generated one (openssl rand -base64 32)"
    if any(ch.isspace() for ch in text):
        return "contains whitespace, which the server's ACL file cannot hold: use a generated one"
    return None


def credentials(values: Iterable[tuple], examples: Iterable[str], min_length: int = MIN_LENGTH) -> list:
    """`values`: (host, variable name, value) for every credential a host uses."""
    examples = list(examples)
    found: dict = {}
    for host, name, value in values:
        problem = _problem(value, examples, min_length)
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
