"""The one password policy for every kvtier credential (L2 ACL users), used by preflight, roles and rendering.

A problem names what to change and never carries the value, so callers may print it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

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


def node_login(user: str, node: str, secret: str) -> tuple:
    """(user, password) of one node's own L2 login: the ACL user `<user>-<node>`, its password derived from the
    cluster's L2 secret, so the vault holds one secret, no node's password is another's, and removing a node from the
    inventory removes its user from the server."""
    name = f"{user}-{node}"
    return name, login_password(secret, name)


def login_password(secret: str, name: str) -> str:
    """The password of the ACL user `name`, derived from `secret` (HMAC-SHA256, URL-safe base64: no whitespace)."""
    digest = hmac.new(str(secret).encode(), f"kvtier L2 login {name}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")
