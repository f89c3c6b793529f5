"""Probes for a Spark serving node: the LMCache MP server and vLLM (standard library only).

Used by the `lmcache_health` module on the nodes (symlinked into module_utils as kvtier_lmcache) and by
kvtier on the controller. It parses:

- Prometheus text exposition (LMCache's ``/metrics`` on the prometheus port, vLLM's ``/metrics``);
- LMCache's ``lmcache_mp_*`` counters (lmcache 0.5.6 serves them at ``/metrics`` on its HTTP API port;
  nothing listened on ``--prometheus-port`` in our measurements) into a per-tier summary: LMCache's L1 (server
  DRAM, kvtier's L0) lookup hits, L2 hits, and load/store counts per L2 adapter (``l2_name`` label: ``resp``,
  ``valkey``, ``fs``, ``p2p``...);
- LMCache's ``/status`` JSON (L1 object count and bytes, L2 adapter health);
- vLLM's ``/v1/models`` (is the model served) and its external-prefix-cache counters.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.request

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{(?P<labels>.*)\})?\s+(?P<value>\S+)(\s+\S+)?$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class ProbeError(Exception):
    """An endpoint did not answer as expected; the message names the URL and what came back."""


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_labels(text: str) -> dict:
    labels, pos = {}, 0
    text = text.strip()
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if not match:
            raise ValueError(f"bad label set {{{text}}}")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
    return labels


def parse_prometheus(text: str) -> list:
    """[(name, labels dict, float)] for every sample; comments and blank lines are skipped."""
    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"line {number} is not a Prometheus sample: {line[:120]!r}")
        raw = match["value"]
        value = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(raw)
        samples.append((match["name"], parse_labels(match["labels"] or ""), float(raw) if value is None else value))
    return samples


def metric_sum(samples, name: str, **labels) -> float:
    """Sum of the samples named `name` whose labels include `labels` (0.0 when there are none)."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items()))


def by_label(samples, name: str, label: str) -> dict:
    """{label value: summed sample} for one metric."""
    out: dict = {}
    for n, lab, v in samples:
        if n == name and label in lab:
            out[lab[label]] = out.get(lab[label], 0.0) + v
    return out


def _counter(samples, base: str, **labels) -> float:
    # prometheus_client exposes counters as <name>_total (and <name>_created); accept both spellings.
    total = metric_sum(samples, base + "_total", **labels)
    return total if total or not any(n == base for n, _, _ in samples) else metric_sum(samples, base, **labels)


def _counter_by(samples, base: str, label: str) -> dict:
    return by_label(samples, base + "_total", label) or by_label(samples, base, label)


def _int(value: float) -> int:
    return int(value) if value == value and abs(value) != math.inf else 0


def lmcache_summary(samples) -> dict:
    """Per-tier view of an LMCache MP server's counters (integers).

    L1 is the server's DRAM; ``l2`` has one entry per L2 adapter (``l2_name``: resp, valkey, fs, p2p ...):
    completed loads (hits served from that tier) and stores, and bytes held.
    """
    loads = _counter_by(samples, "lmcache_mp_l2_load_completed_requests", "l2_name")
    stores = _counter_by(samples, "lmcache_mp_l2_store_completed_requests", "l2_name")
    usage = by_label(samples, "lmcache_mp_l2_usage_bytes", "l2_name")
    names = sorted(set(loads) | set(stores) | set(usage))
    return {
        "lookups": _int(_counter(samples, "lmcache_mp_lookups_requests")),
        "requested_tokens": _int(_counter(samples, "lmcache_mp_lookup_requested_tokens")),
        "hit_tokens": _int(_counter(samples, "lmcache_mp_lookup_hit_tokens")),
        "l1_hit_tokens": _int(_counter(samples, "lmcache_mp_lookup_hit_l1_tokens")),
        "l2_hit_tokens": _int(_counter(samples, "lmcache_mp_lookup_hit_l2_tokens")),
        "l1_write_chunks": _int(_counter(samples, "lmcache_mp_l1_write_chunks")),
        "l1_read_chunks": _int(_counter(samples, "lmcache_mp_l1_read_chunks")),
        "l1_memory_usage_bytes": _int(metric_sum(samples, "lmcache_mp_l1_memory_usage_bytes")),
        "l2_store_requests_completed": _int(sum(stores.values())),
        # lmcache 0.5.6 counts submitted store requests in total only; completed ones per adapter (l2_name).
        "l2_store_requests_submitted": _int(_counter(samples, "lmcache_mp_l2_store_submitted_requests")),
        # Chunks a lower tier reported present and then failed to load (LMCache trims the hit before them).
        "l2_prefetch_failures": _int(_counter(samples, "lmcache_mp_l2_prefetch_failure_chunks")),
        "l2": {
            name: {
                "loads": _int(loads.get(name, 0.0)),
                "stores": _int(stores.get(name, 0.0)),
                "usage_bytes": _int(usage.get(name, 0.0)),
            }
            for name in names
        },
    }


def vllm_summary(samples) -> dict:
    """vLLM's counters that show KV transfer from LMCache (integers)."""
    by_source = by_label(samples, "vllm:prompt_tokens_by_source_total", "source")
    return {
        "external_prefix_cache_hits": _int(metric_sum(samples, "vllm:external_prefix_cache_hits_total")),
        "external_prefix_cache_queries": _int(metric_sum(samples, "vllm:external_prefix_cache_queries_total")),
        "prompt_tokens": _int(metric_sum(samples, "vllm:prompt_tokens_total")),
        "prompt_tokens_by_source": {k: _int(v) for k, v in sorted(by_source.items())},
        "requests_running": _int(metric_sum(samples, "vllm:num_requests_running")),
    }


def _find(obj, key: str):
    """First value stored under `key` anywhere in a JSON document (depth first)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for value in obj.values():
            found = _find(value, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for value in obj:
            found = _find(value, key)
            if found is not None:
                return found
    return None


def status_summary(status: dict) -> dict:
    """The parts of LMCache's /status a check needs: L1 objects/bytes, P2P state, unhealthy parts."""
    unhealthy = []

    def walk(obj, path):
        if isinstance(obj, dict):
            for key, value in obj.items():
                sub = f"{path}.{key}" if path else str(key)
                if key in ("healthy", "is_healthy", "thread_alive", "event_loop_alive") and value is False:
                    unhealthy.append((path or "server") + ("" if key in ("healthy", "is_healthy") else f" ({key})"))
                walk(value, sub)
        elif isinstance(obj, list):
            for i, value in enumerate(obj):
                walk(value, f"{path}[{i}]")

    walk(status, "")
    objects = _find(status, "total_object_count")
    used = _find(status, "memory_used_bytes")
    peers = _find(status, "p2p_peers")
    return {
        "l1_objects": objects if isinstance(objects, int) else None,
        "l1_used_bytes": used if isinstance(used, int) else None,
        "p2p_enabled": _find(status, "p2p_enabled") is True,
        "p2p_state": _find(status, "p2p_state"),
        "p2p_peers": sorted(str(p) for p in peers) if isinstance(peers, list) else [],
        "unhealthy": unhealthy,
    }


def p2p_problems(status: dict, min_peers: int) -> list:
    """Why a P2P-enabled server is not serving peers yet (empty when it is registered with enough peers).

    A server whose coordinator is unreachable still answers /healthcheck, and every lookup then misses:
    the silent P2P failure this check exists for."""
    if not status.get("p2p_enabled"):
        return ["LMCache P2P is not enabled on this server (no --coordinator-url/--p2p-advertise-url took effect)"]
    if status.get("p2p_state") != "registered":
        return [f"LMCache P2P state is {status.get('p2p_state')!r}, not 'registered' with the coordinator"]
    if len(status.get("p2p_peers", [])) < min_peers:
        return [
            f"LMCache P2P sees {len(status['p2p_peers'])} peer(s) {status['p2p_peers']}, expected at least {min_peers}"
        ]
    return []


def served_models(models: dict) -> list:
    """Model ids listed by vLLM's /v1/models."""
    return [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]


# vLLM's API key on a Spark: root's only, in the file its unit reads (the vllm_lmcache role writes it). A probe on the
# node reads it there, so the key never travels in a module argument or a command line.
VLLM_SECRETS_FILE = "/etc/kvtier/vllm-secrets.env"


def node_api_key(path: str = VLLM_SECRETS_FILE) -> str:
    """The node's own vLLM API key (VLLM_API_KEY in its secrets file); "" where there is none or it is unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                name, sep, value = line.strip().partition("=")
                if sep and name == "VLLM_API_KEY":
                    if len(value) >= 2 and value[0] == value[-1] == '"':
                        value = re.sub(r"\\(.)", r"\1", value[1:-1])
                    return value
    except OSError:
        pass
    return ""


def auth_headers(api_key: str) -> dict:
    """The header vLLM's /v1 routes (and the router) want for `api_key`; none without one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def http_get(url: str, timeout: float = 5.0, api_key: str = "") -> tuple:
    """(status, body text) of a GET; connection problems raise ProbeError."""
    try:
        request = urllib.request.Request(url, headers=auth_headers(api_key))
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 (fixed http URLs)
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ProbeError(f"{url}: {reason}") from None


def get_json(url: str, timeout: float = 5.0, api_key: str = ""):
    status, body = http_get(url, timeout, api_key)
    if status != 200:
        raise ProbeError(f"{url} answered HTTP {status}: {body[:200]}")
    try:
        return json.loads(body)
    except ValueError:
        raise ProbeError(f"{url} did not return JSON: {body[:200]!r}") from None


def get_metrics(url: str, timeout: float = 5.0) -> list:
    status, body = http_get(url, timeout)
    if status != 200:
        raise ProbeError(f"{url} answered HTTP {status}: {body[:200]}")
    try:
        return parse_prometheus(body)
    except ValueError as exc:
        raise ProbeError(f"{url}: {exc}") from None


def summary_after(url: str, seconds: float = 1.0) -> dict | None:
    """`lmcache_summary` of the counters at `url`, read `seconds` from now; None when they cannot be read then (a
    server that is down is named by `probe_node`, and must not stop the other checks of its node)."""
    time.sleep(seconds)
    try:
        return lmcache_summary(get_metrics(url))
    except ProbeError:
        return None


def probe_node(endpoints: dict, model: str | None = None, timeout: float = 5.0, p2p_peers: int | None = None) -> dict:
    """Health of one serving node. `endpoints` as rendered by kvtier.cluster (vllm, lmcache_http,
    lmcache_metrics); any of them may be absent. With `p2p_peers` (needs lmcache_http), the server must be
    registered with the P2P coordinator and see at least that many peers.
    Returns a dict with ``problems`` (empty when healthy)."""
    result: dict = {"problems": []}
    problems = result["problems"]
    if endpoints.get("lmcache_http"):
        base = endpoints["lmcache_http"].rstrip("/")
        try:
            status, body = http_get(base + "/healthcheck", timeout)
            result["lmcache_healthy"] = status == 200
            if status != 200:
                problems.append(f"LMCache {base}/healthcheck answered HTTP {status}: {body[:200]}")
        except ProbeError as exc:
            result["lmcache_healthy"] = False
            problems.append(f"LMCache server not answering: {exc}")
        if result["lmcache_healthy"]:
            try:
                result["lmcache_status"] = status_summary(get_json(base + "/status", timeout))
                if result["lmcache_status"]["unhealthy"]:
                    problems.append(
                        "LMCache /status reports unhealthy parts: " + ", ".join(result["lmcache_status"]["unhealthy"])
                    )
                if p2p_peers is not None:
                    problems.extend(p2p_problems(result["lmcache_status"], p2p_peers))
            except ProbeError as exc:
                problems.append(str(exc))
    if endpoints.get("lmcache_metrics"):
        try:
            result["lmcache"] = lmcache_summary(get_metrics(endpoints["lmcache_metrics"], timeout))
        except ProbeError as exc:
            problems.append(f"LMCache metrics: {exc}")
    if endpoints.get("vllm"):
        base = endpoints["vllm"].rstrip("/")
        try:
            status, _ = http_get(base + "/health", timeout)
            result["vllm_healthy"] = status == 200
            if status != 200:
                problems.append(f"vLLM {base}/health answered HTTP {status}")
        except ProbeError as exc:
            result["vllm_healthy"] = False
            problems.append(f"vLLM not answering: {exc}")
        if result["vllm_healthy"]:
            try:
                result["models"] = served_models(get_json(base + "/v1/models", timeout, node_api_key()))
                if model is not None and model not in result["models"]:
                    problems.append(f"vLLM at {base} serves {result['models']}, not {model!r}")
                result["vllm"] = vllm_summary(get_metrics(base + "/metrics", timeout))
            except ProbeError as exc:
                problems.append(str(exc))
    return result


# A hit must give the answer the cold computation gives: the proofs compare this many greedy tokens, each with its
# top-2 log-probabilities. Where the cold run's two best tokens are closer than NEAR_TIE (natural log), another
# token may win by rounding alone (a GPU's kernels differ between a prefill and a cached load), and no more is read.
ANSWER_TOKENS = 4
NEAR_TIE = 0.05


def complete(
    base: str,
    model: str,
    prompt: str,
    timeout: float = 300.0,
    cache_salt: str = "",
    answer_tokens: int = 1,
    api_key: str | None = None,
) -> dict:
    """One completion, as a client sends it (greedy); what vLLM said and how long it took.

    Returns ``status`` (HTTP status, 0 when there was no answer), ``cached_tokens`` (the prompt tokens served
    from a cache: vLLM's prompt_tokens_details, needs --enable-prompt-tokens-details), ``prompt_tokens``,
    ``seconds`` (the whole request: with one output token, close to the time to first token), ``error``, and
    the answer: ``tokens`` and ``top_logprobs`` (the two best tokens at each step) of `answer_tokens` tokens.
    A ``cache_salt`` (vLLM's request field, which LMCache puts in every object key) keeps the request's cache
    entries apart from every other request's. `api_key`: vLLM's key; by default the node's own (`node_api_key`).
    """
    fields = {"model": model, "prompt": prompt, "max_tokens": answer_tokens, "temperature": 0, "logprobs": 2}
    if cache_salt:
        fields["cache_salt"] = cache_salt
    body = json.dumps(fields).encode()
    request = urllib.request.Request(
        base.rstrip("/") + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", **auth_headers(node_api_key() if api_key is None else api_key)},
    )
    started = time.monotonic()
    result = {"status": 0, "cached_tokens": 0, "prompt_tokens": 0, "seconds": 0.0, "error": ""}
    result.update(tokens=[], top_logprobs=[])
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (fixed http URL)
            answer = json.load(reply)
            usage = answer.get("usage") or {}
            result["status"] = reply.status
            result["prompt_tokens"] = usage.get("prompt_tokens") or 0
            result["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            logprobs = ((answer.get("choices") or [{}])[0]).get("logprobs") or {}
            result["tokens"] = list(logprobs.get("tokens") or [])
            result["top_logprobs"] = [dict(top or {}) for top in logprobs.get("top_logprobs") or []]
    except urllib.error.HTTPError as exc:
        result["status"] = exc.code
        result["error"] = exc.read().decode("utf-8", "replace")[:500]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        result["error"] = str(getattr(exc, "reason", exc))
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def answer_difference(cold: dict, hit: dict, near_tie: float = NEAR_TIE) -> str | None:
    """Why a cache hit's greedy answer is not the cold computation's; None when it is the same.

    The first differing token decides: a difference where the cold run's two best tokens are within `near_tie` is a
    near-tie (no more is compared: the texts part there); any other is a wrong answer from the cache."""
    want_tokens, got_tokens = cold.get("tokens") or [], hit.get("tokens") or []
    tops = cold.get("top_logprobs") or []
    for index, (want, got) in enumerate(zip(want_tokens, got_tokens, strict=False)):
        if want == got:
            continue
        top = sorted((tops[index] if index < len(tops) else {}).values(), reverse=True)
        margin = top[0] - top[1] if len(top) > 1 else float("inf")
        if margin < near_tie:
            return None
        return f"token {index + 1} is {got!r} where the cold computation gave {want!r} (its lead {margin:.3g} nats)"
    if len(got_tokens) != len(want_tokens):
        return f"{len(got_tokens)} answer tokens where the cold computation gave {len(want_tokens)}"
    return None


# --- a salted request's own cache entries (the canary) -------------------------------------------------------
# LMCache (0.5.6) names an object by model, rank, object group, chunk hash and the request's cache salt: its fs
# adapter writes one file per object, <model with "/" as "-SEP-">@0x<rank>@<group>@<hash>@<salt>.data, and its RESP
# adapter one key, <model>@<rank>@<group>@<hash>@<salt>. Neither a model name nor a salt may contain "@".


def salted_object_key(name: str, salt: str) -> dict | None:
    """The object key (the wire form of LMCache's HTTP API) that an fs file name or a RESP key stands for, when it
    carries `salt`; None for any other name."""
    stem = name[: -len(".data")] if name.endswith(".data") else name
    parts = stem.split("@")
    if len(parts) != 5 or parts[4] != salt or not salt:
        return None
    model, rank, group, chunk_hash = parts[:4]
    try:
        bytes.fromhex(chunk_hash)
        return {
            "chunk_hash_hex": chunk_hash,
            "model_name": model.replace("-SEP-", "/"),
            "kv_rank": int(rank, 16),
            "object_group_id": int(group, 16),
            "cache_salt": salt,
        }
    except ValueError:
        return None


def l3_salted_keys(path: str, salt: str) -> list:
    """The object keys of `salt` that LMCache's fs adapter holds in the L3 directory `path`."""
    keys = (salted_object_key(name, salt) for name in sorted(os.listdir(path)) if name.endswith(f"@{salt}.data"))
    return [key for key in keys if key]


def forget(lmcache_http: str, keys: list, tier: str, adapter: str | None = None, timeout: float = 30.0) -> dict:
    """Remove these object keys from one tier of one LMCache server (its DELETE /cache/objects): ``l1`` its DRAM,
    ``l2`` the L2 adapter named `adapter` (a shared store: removed for every server). Raises ProbeError when
    LMCache refused or failed."""
    fields = {"keys": keys, "tier": tier, "force": True}
    if adapter:
        fields["adapter"] = adapter
    request = urllib.request.Request(
        lmcache_http.rstrip("/") + "/cache/objects",
        data=json.dumps(fields).encode(),
        headers={"Content-Type": "application/json"},
        method="DELETE",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (fixed http URL)
            result = json.load(reply)
    except urllib.error.HTTPError as exc:
        said = exc.read().decode("utf-8", "replace")[:200]
        raise ProbeError(f"{request.full_url} answered HTTP {exc.code}: {said}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ProbeError(f"{request.full_url}: {getattr(exc, 'reason', exc)}") from None
    if not result.get("ok", True):
        raise ProbeError(f"LMCache could not remove {len(keys)} keys from {adapter or tier}: {result.get('error')}")
    return result


def clear_dram(lmcache_http: str, timeout: float = 30.0) -> dict:
    """Empty one LMCache server's DRAM (its POST /cache/clear, tier l1: what `lmcache kvcache clear` sends), over HTTP
    so it works the same whether the server runs from a venv or in a container."""
    request = urllib.request.Request(
        lmcache_http.rstrip("/") + "/cache/clear",
        data=json.dumps({"tier": "l1"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (fixed http URL)
            return json.load(reply)
    except urllib.error.HTTPError as exc:
        said = exc.read().decode("utf-8", "replace")[:200]
        raise ProbeError(f"{request.full_url} answered HTTP {exc.code}: {said}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ProbeError(f"{request.full_url}: {getattr(exc, 'reason', exc)}") from None


CANARY_TEXT = "/usr/share/common-licenses/GPL-3"  # on every Debian and Ubuntu host: a long, stable prompt body


def canary_prompt(salt: str, chunk_size: int, chunks: int = 3, text_file: str = CANARY_TEXT) -> str:
    """A short prompt that says what it is: `chunks` full chunks and a little more (about four characters a
    token, whatever the tokenizer)."""
    with open(text_file, encoding="utf-8", errors="replace") as handle:
        body = handle.read(4 * (chunks + 1) * chunk_size)
    return f"kvtier canary {salt} (a health probe; safe to ignore): {body}"


def plant(
    endpoints: dict,
    model: str,
    prompt: str,
    salt: str,
    chunk_size: int,
    adapters: list,
    l3_path: str | None = None,
    timeout: float = 60.0,
) -> dict:
    """Send a new salted prompt and wait until its entries are stored: ``cold`` (vLLM's answer), ``late`` (the
    persistent adapters that completed no store within `timeout`) and ``keys`` (its object keys, read from the
    L3 directory once every full chunk is there; empty without `l3_path`)."""
    metrics = endpoints["lmcache_metrics"]
    before = lmcache_summary(get_metrics(metrics))
    cold = complete(endpoints["vllm"], model, prompt, 600.0, salt, ANSWER_TOKENS)
    if cold["status"] != 200:
        raise ProbeError(f"the canary's request failed: HTTP {cold['status']} {cold['error'][:200]}")
    deadline = time.monotonic() + timeout
    late = list(adapters)
    while late and time.monotonic() < deadline:
        now = lmcache_summary(get_metrics(metrics))
        late = [
            a for a in adapters if now["l2"].get(a, {}).get("stores", 0) <= before["l2"].get(a, {}).get("stores", 0)
        ]
        if late:
            time.sleep(1)
    keys, wanted = [], cold["prompt_tokens"] // chunk_size
    while l3_path:
        keys = l3_salted_keys(l3_path, salt)
        if len(keys) >= wanted or time.monotonic() > deadline:
            break
        time.sleep(1)
    return {"cold": cold, "late": late, "keys": keys, "wanted": wanted}


def serve(endpoints: dict, model: str, prompt: str, salt: str) -> dict:
    """The salted prompt again: vLLM's answer and what LMCache's counters say served it (``l1_hit_tokens``: its
    DRAM; ``loads``: completed loads per L2 adapter) over the request."""
    metrics = endpoints["lmcache_metrics"]
    before = lmcache_summary(get_metrics(metrics))
    reply = complete(endpoints["vllm"], model, prompt, 600.0, salt, ANSWER_TOKENS)
    after = lmcache_summary(get_metrics(metrics))
    loads = {a: v["loads"] - before["l2"].get(a, {}).get("loads", 0) for a, v in after["l2"].items()}
    return {"reply": reply, "l1_hit_tokens": after["l1_hit_tokens"] - before["l1_hit_tokens"], "loads": loads}
