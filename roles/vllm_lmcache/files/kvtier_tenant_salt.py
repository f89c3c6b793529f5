"""vLLM middleware (``--middleware kvtier_tenant_salt.TenantSalt``): the router's tenant salt is the cache salt.

The router authenticates each client by its tenant's key and sends the tenant's salt in X-Kvtier-Tenant-Salt (a
header it removes from what clients send). Here that salt replaces any ``cache_salt`` in the JSON body, so a tenant
can neither read nor plant another tenant's cache entries (vLLM and LMCache key every entry by the salt). A request
without the header comes from a holder of vLLM's own key (kvtier's probes) and is left as it is.
"""

import json

HEADER = b"x-kvtier-tenant-salt"  # kvtier.cluster.tenants.SALT_HEADER, lower case as ASGI gives it


class TenantSalt:
    """Pure ASGI middleware: reads a POST body once, rewrites its cache salt, hands the new body on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        headers = list(scope.get("headers") or [])
        salt = next((value for name, value in headers if name.lower() == HEADER), None)
        if salt is None:
            return await self.app(scope, receive, send)
        parts = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before its body arrived
                return None
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = salted(b"".join(parts), salt.decode("latin-1"))
        keep = [(n, v) for n, v in headers if n.lower() not in (HEADER, b"content-length")]
        scope = dict(scope, headers=[*keep, (b"content-length", str(len(body)).encode())])
        delivered = False

        async def replay():
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def salted(body: bytes, salt: str) -> bytes:
    """The JSON request `body` with its cache_salt set to `salt`; a body that is not a JSON object, unchanged."""
    try:
        fields = json.loads(body)
    except ValueError:
        return body
    if not isinstance(fields, dict):
        return body
    fields["cache_salt"] = salt
    return json.dumps(fields).encode()
