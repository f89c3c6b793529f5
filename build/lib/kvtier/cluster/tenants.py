"""Tenants at the router: each tenant's cache salt, which the Sparks put in every request the router sends for it."""

from __future__ import annotations

import hashlib
import hmac

# The header that carries the salt from the router to vLLM (the kvtier_tenant_salt middleware reads it).
SALT_HEADER = "X-Kvtier-Tenant-Salt"


def salt(secret: str, name: str) -> str:
    """A tenant's cache salt: HMAC-SHA256 of its name under the cluster secret, so it cannot be guessed from the name
    and stays the same on every run (LMCache keys entries by it; hex has no "@", which LMCache's keys separate by)."""
    return hmac.new(str(secret).encode(), str(name).encode(), hashlib.sha256).hexdigest()[:32]
