"""The one password policy for every kvtier credential (L2 ACL users), used by preflight, roles and rendering.

A problem names what to change and never carries the value, so callers may print it.
"""

from __future__ import annotations

MIN_LENGTH = 16
# Values from examples and docs (inventory/example's vault placeholders among them); compared without case.
EXAMPLE_PASSWORDS = frozenset(
    {"changeme", "change-me", "change_me", "secret", "password", "lmcache", "admin", "example"}
)
_GENERATE = "openssl rand -base64 32"


def problem(value) -> str | None:
    """Why `value` is not an acceptable password, or None when it is."""
    if value is None or str(value) == "":
        return "is not set: define it in a vault (see inventory/example/group_vars/all/vault.yml)"
    text = str(value)
    if text.lower() in EXAMPLE_PASSWORDS:
        return f"still has an example value: replace it with a generated one ({_GENERATE}) in a vault"
    if len(text) < MIN_LENGTH:
        return f"is shorter than {MIN_LENGTH} characters: use a generated one ({_GENERATE})"
    if any(ch.isspace() for ch in text):
        return "contains whitespace, which the server's ACL file cannot hold: use a generated one"
    return None


def problems(value, name: str) -> list:
    """[] when `value` is acceptable, else one message that starts with the variable `name`."""
    found = problem(value)
    return [] if found is None else [f"{name} {found}"]
