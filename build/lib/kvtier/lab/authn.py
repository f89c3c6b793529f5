"""The lab's attacker, part two: what gets past the firewall must still authenticate, and tenants stay apart.

Run from the lab host, which the firewall admits to the router, its statistics page and each Spark's vLLM (as a real
cluster's controller). Every refused request has its positive control: the same request with the right key is
answered, so a row cannot pass because a service is down. Then tenant B sends tenant A's prompt, even with A's cache
salt in the body, and gets no cached token, while A's repeat and B's own repeat hit.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request

from kvtier.cluster import tenants
from kvtier.lab import credentials
from kvtier.lab.stages import StageFailed
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import router as router_probe


def _status(url: str, headers: dict | None = None) -> int:
    """The HTTP status a GET of `url` gets (0: no answer)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as reply:  # noqa: S310
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def _bearer(key: str) -> dict:
    return lmcache_probe.auth_headers(key)


def rows(router, vllm_url: str, vllm_key: str) -> list:
    """(what, refused status, allowed status): each attempt without the credential, then with it."""
    other = secrets.token_urlsafe(24)  # a key no tenant has
    stats = router.stats_url + ";csv"
    return [
        (
            "a Spark's vLLM without its API key (the key: 200)",
            _status(f"{vllm_url}/v1/models"),
            _status(f"{vllm_url}/v1/models", _bearer(vllm_key)),
        ),
        (
            "the router without a tenant's key (a tenant's key: 200)",
            _status(f"{router.url}/v1/models"),
            _status(f"{router.url}/v1/models", _bearer(router.key)),
        ),
        (
            "the router with a key no tenant has",
            _status(f"{router.url}/v1/models", _bearer(other)),
            _status(f"{router.url}/v1/models", _bearer(router.key)),
        ),
        (
            "the router with vLLM's own key (not a tenant's)",
            _status(f"{router.url}/v1/models", _bearer(vllm_key)),
            _status(f"{router.url}/v1/models", _bearer(router.key)),
        ),
        (
            "the router's statistics page without its login",
            _status(stats),
            _status(stats, {"Authorization": router_probe.basic_auth(*router.stats_login)}),
        ),
    ]


def _complete(router, model: str, prompt: str, key: str, salt: str = "") -> dict:
    reply = lmcache_probe.complete(router.url, model, prompt, 300.0, salt, 1, api_key=key)
    if reply["status"] != 200:
        raise StageFailed(f"the router refused a tenant's request: HTTP {reply['status']} {reply['error'][:200]}")
    return reply


def tenant_isolation(router, model: str) -> list:
    """(request, cached tokens) in order: A cold, A again, B with A's prompt and A's salt in the body, B again."""
    a, b = (router.tenant_keys[name] for name in credentials.TENANTS)
    a_salt = tenants.salt(credentials.passwords(credentials.STATE)["router_cache_salt_secret"], credentials.TENANTS[0])
    prompt = f"kvtier lab tenant check {secrets.token_hex(4)}: " + " ".join(f"t{n % 89}" for n in range(300))
    steps = [
        ("tenant A, first", a, ""),
        ("tenant A, again", a, ""),
        ("tenant B, A's prompt with A's salt in the body", b, a_salt),
        ("tenant B, again", b, a_salt),
    ]
    return [(what, _complete(router, model, prompt, key, salt)["cached_tokens"]) for what, key, salt in steps]


def run(out, router, vllm_url: str, model: str) -> str:
    vllm_key = credentials.passwords(credentials.STATE)["vllm_lmcache_api_key"]
    bad = []
    table = rows(router, vllm_url, vllm_key)
    for what, refused, allowed in table:
        out(f"  {what}: HTTP {refused}; with it HTTP {allowed}")
        if refused != 401 or allowed != 200:
            bad.append(f"{what}: {refused} without, {allowed} with")
    cached = tenant_isolation(router, model)
    out("  " + json.dumps(dict(cached)))
    (_, a_cold), (_, a_again), (_, b_first), (_, b_again) = cached
    if a_again <= 0 or b_again <= 0:
        bad.append(f"a tenant's repeat did not hit (A {a_again}, B {b_again} cached tokens): the check proves nothing")
    if b_first != 0:
        bad.append(f"tenant B got {b_first} cached tokens of tenant A's prompt")
    if bad:
        raise StageFailed("; ".join(bad))
    return (
        f"{len(table)} requests refused (401) without the key, answered with it; tenant B 0 cached tokens of A's "
        f"prompt (A's repeat {a_again}, B's repeat {b_again})"
    )
