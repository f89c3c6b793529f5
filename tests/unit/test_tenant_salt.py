"""vLLM's tenant-salt middleware (roles/vllm_lmcache/files/kvtier_tenant_salt.py) around a minimal ASGI app: the
router's salt header replaces whatever cache salt the client wrote; a request without it is left as it is."""

import asyncio
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "roles" / "vllm_lmcache" / "files"))

import kvtier_tenant_salt  # noqa: E402

from kvtier.cluster import render, tenants  # noqa: E402


def _app_seen():
    seen = {}

    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.update(headers=dict(scope["headers"]), body=body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app, seen


def _call(method: str, body: bytes, headers: list, parts: int = 1) -> dict:
    app, seen = _app_seen()
    middleware = kvtier_tenant_salt.TenantSalt(app)
    size = max(1, len(body) // parts + 1)
    chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    async def send(message):
        pass

    scope = {"type": "http", "method": method, "path": "/v1/completions", "headers": headers}
    asyncio.run(middleware(scope, receive, send))
    return seen


def test_the_router_salt_replaces_the_clients_and_the_length_follows():
    header = tenants.SALT_HEADER.lower().encode()
    body = json.dumps({"prompt": "p", "cache_salt": "chosen-by-the-client"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (header, b"s1")]
    seen = _call("POST", body, headers, parts=3)
    assert json.loads(seen["body"]) == {"prompt": "p", "cache_salt": "s1"}
    assert seen["headers"][b"content-length"] == str(len(seen["body"])).encode()
    assert header not in seen["headers"]  # vLLM never sees the salt outside the body
    # The same from a client that sent no salt of its own.
    seen = _call("POST", json.dumps({"prompt": "p"}).encode(), [(header, b"s2")])
    assert json.loads(seen["body"])["cache_salt"] == "s2"


def test_requests_without_the_header_or_not_json_pass_unchanged():
    body = json.dumps({"prompt": "p", "cache_salt": "probe"}).encode()
    assert _call("POST", body, [])["body"] == body  # kvtier's probes, with vLLM's own key
    assert _call("POST", b"not json", [(b"x-kvtier-tenant-salt", b"s")])["body"] == b"not json"
    assert _call("GET", b"", [(b"x-kvtier-tenant-salt", b"s")])["body"] == b""


def test_vllm_loads_it_and_its_key_stays_out_of_argv():
    spec_module = _spec()
    proc = render.vllm(spec_module, "spark01", "vllm-key-0123456789abcdef")
    argv = list(proc.argv)
    assert argv[argv.index("--middleware") + 1] == render.TENANT_SALT_MIDDLEWARE
    assert proc.secret_env == {"VLLM_API_KEY": "vllm-key-0123456789abcdef"}
    assert not any("vllm-key" in a for a in argv)
    assert render.TENANT_SALT_MIDDLEWARE.split(".")[0] == kvtier_tenant_salt.__name__


def _spec():
    from kvtier.cluster import load_spec
    from tests.unit._cluster_data import spec_dict

    return load_spec(spec_dict())
