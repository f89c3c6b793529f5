"""Cache warmup and time to first token on a serving node (standard library only).

Runs on the Spark itself, against its own vLLM, next to the LMCache counters it reads (LMCache's API listens on
loopback only): the ``kvtier_warmup`` module (symlinked into module_utils as kvtier_warmup), ``kvtier warmup`` and
``kvtier bench ttft`` feed this file to the node's python3. It imports nothing from kvtier: the caller passes a
``counters()`` function that returns LMCache's per-tier summary (kvtier/probes/lmcache.py's lmcache_summary).

Prompts are token ids, not text: a corpus entry of N tokens is exactly N tokens on every run, so a replay asks
LMCache for the same chunks and the bench's context sizes are the sizes measured. Generated documents start with
their own tag, so no two share a chunk (LMCache keys a chunk by every token before it).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None for no values."""
    data = sorted(values)
    if not data:
        return None
    rank = (len(data) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


def stats(values) -> dict:
    """count, median, p95, min and max of a list of seconds (rounded to the millisecond)."""
    data = [v for v in values if v is not None]

    def rounded(v):
        return None if v is None else round(v, 4)

    return {
        "count": len(data),
        "p50": rounded(percentile(data, 50)),
        "p95": rounded(percentile(data, 95)),
        "min": rounded(min(data, default=None)),
        "max": rounded(max(data, default=None)),
    }


def cacheable_tokens(prompt_tokens: int, chunk_size: int) -> int:
    """The prompt tokens a cache can serve: its whole chunks, and never the last token (vLLM always computes it)."""
    return max(min(prompt_tokens - 1, prompt_tokens // chunk_size * chunk_size), 0)


def whole_chunk_tokens(tokens: int, chunk_size: int) -> int:
    return tokens // chunk_size * chunk_size


def _post(url: str, body: dict, timeout: float, api_key: str = ""):
    """POST JSON to vLLM; with `api_key`, as vLLM's API key (its /v1 routes refuse a request without it)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (the node's own vLLM, or the router)


def tokenize(base: str, model: str, text: str, timeout: float = 60.0) -> list:
    """vLLM's token ids for `text` (its /tokenize endpoint, no special tokens added)."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    with _post(base.rstrip("/") + "/tokenize", body, timeout) as reply:
        return json.load(reply)["tokens"]


class Documents:
    """Prompts of exact token lengths, made from one text: each is its tag's tokens, then the text's tokens
    (repeated as often as the length needs). The text is tokenized once."""

    def __init__(self, base: str, model: str, text: str):
        self.base, self.model = base, model
        self.body = tokenize(base, model, text)
        if not self.body:
            raise ValueError("the document text has no tokens")

    def make(self, tag: str, tokens: int) -> list:
        head = tokenize(self.base, self.model, f"{tag}: ")
        if tokens <= len(head):
            raise ValueError(f"a document of {tokens} tokens is shorter than its tag {tag!r} ({len(head)} tokens)")
        need = tokens - len(head)
        body = self.body * (need // len(self.body) + 1)
        return head + body[:need]


def length_entries(lengths: list, repeat: int = 1) -> list:
    """Corpus entries for documents of these token lengths, each `repeat` times (the ids make each its own)."""
    return [{"tokens": n, "id": f"{n}-{i}-{r}"} for r in range(repeat) for i, n in enumerate(lengths)]


def corpus_problems(entries: list, max_model_len: int | None = None) -> list:
    """Why a corpus cannot be sent, one line per problem ([] when it can): checked before any request."""
    problems = [] if entries else ["the corpus is empty: give prompts or token lengths"]
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or ("prompt" in entry) == ("tokens" in entry):
            problems.append(f"entry {index} needs exactly one of 'prompt' (text) or 'tokens' (a length)")
        elif "tokens" in entry:
            tokens = entry["tokens"]
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 8:
                problems.append(f"entry {index}: tokens must be a whole number of at least 8, not {tokens!r}")
            elif max_model_len and tokens >= max_model_len:
                problems.append(
                    f"entry {index}: {tokens} tokens do not fit max_model_len {max_model_len} (the reply needs a token)"
                )
        elif not isinstance(entry["prompt"], str) or not entry["prompt"]:
            problems.append(f"entry {index}: prompt must be non-empty text")
    return problems


def corpus_prompts(base: str, model: str, entries: list, text_file: str, name: str) -> list:
    """The prompts of a corpus: an entry ``{"prompt": text}`` is sent as it is, ``{"tokens": N}`` becomes a
    document of exactly N tokens tagged with `name` and the entry's ``id`` (or its position), made from
    `text_file` (a local text on the node). The same corpus and name give the same prompts on every run."""
    documents = None
    prompts = []
    for index, entry in enumerate(entries):
        if "prompt" in entry:
            prompts.append(entry["prompt"])
            continue
        if documents is None:
            with open(text_file, encoding="utf-8", errors="replace") as fh:
                documents = Documents(base, model, fh.read())
        prompts.append(documents.make(f"{name} {entry.get('id', index)}", int(entry["tokens"])))
    return prompts


def stream_complete(
    base: str, model: str, prompt, timeout: float = 600.0, max_tokens: int = 1, api_key: str = ""
) -> dict:
    """One streamed completion, as a client sends it, timed at its first token.

    `prompt` is text or a list of token ids. Returns ``status`` (HTTP status, 0 when nothing answered),
    ``ttft`` (seconds to the first streamed token), ``seconds`` (the whole request), ``prompt_tokens``,
    ``cached_tokens`` (prompt tokens served from a cache: vLLM's usage, needs --enable-prompt-tokens-details)
    and ``error``. `api_key`: vLLM's API key, or a tenant's key at the router."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = {"status": 0, "ttft": None, "seconds": 0.0, "prompt_tokens": 0, "cached_tokens": 0, "error": ""}
    started = time.monotonic()
    try:
        with _post(base.rstrip("/") + "/v1/completions", body, timeout, api_key) as reply:
            result["status"] = reply.status
            for raw in reply:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if result["ttft"] is None and event.get("choices"):
                    result["ttft"] = round(time.monotonic() - started, 4)
                usage = event.get("usage") or {}
                if usage:
                    result["prompt_tokens"] = usage.get("prompt_tokens") or 0
                    result["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except urllib.error.HTTPError as exc:
        result["status"] = exc.code
        result["error"] = exc.read().decode("utf-8", "replace")[:500]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        result["error"] = str(getattr(exc, "reason", exc))
    result["seconds"] = round(time.monotonic() - started, 4)
    if result["status"] == 200 and result["ttft"] is None and not result["error"]:
        result["error"] = "the stream ended without a token"
    return result


def send_all(base: str, model: str, prompts: list, concurrency: int, timeout: float = 600.0, api_key: str = "") -> list:
    """stream_complete for every prompt, at most `concurrency` at a time; the replies in the prompts' order."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(lambda p: stream_complete(base, model, p, timeout, api_key=api_key), prompts))


def _failed(replies: list) -> list:
    return [r for r in replies if r["status"] != 200 or r["error"]]


# LMCache adapters that kvtier points at one store shared by every Spark and that skip what is already there.
SHARED_ADAPTERS = ("fs",)


def wait_stored(counters, before: dict, adapters: list, expected: int, timeout: float, poll: float = 1.0) -> dict:
    """Stores are asynchronous: wait until LMCache has stored the warmup's `expected` new chunks in each persistent
    adapter. LMCache 0.5.6 gathers the keys written to its DRAM since its store loop's last turn into one store task
    per adapter, so a task may carry several prompts' chunks or part of one (8 new prompts made 8 to 10 tasks in
    the lab): its task counters cannot count prompts. Done when its DRAM took `expected` more chunks, every store
    task it submitted has completed (submitted, in total, equals completed over all adapters), neither count moved
    for `poll` seconds (longer than its store loop's 0.5 s wait for new keys), and each persistent adapter completed
    a task since `before` and, unless shared, holds more bytes (0.5.6 counts a failed store as completed; its usage
    does not grow). The fs adapter's bytes are not required to grow: kvtier's L3 is one directory shared by every Spark,
    and fs completes a store without writing the chunks another Spark already wrote (measured: spark02's fs bytes
    stood still for 120 s while its stores completed).
    Returns {adapter: {stores, bytes}} (the growth seen), ``late`` (adapters that stored nothing new by the
    deadline), ``pending`` (what else was unfinished then, one line each) and the last ``counters``."""
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        now = counters()
        grown = {}
        for name in adapters:
            was, is_ = before["l2"].get(name, {}), now["l2"].get(name, {})
            grown[name] = {
                "stores": is_.get("stores", 0) - was.get("stores", 0),
                "bytes": is_.get("usage_bytes", 0) - was.get("usage_bytes", 0),
            }
        late = [n for n in adapters if grown[n]["stores"] < 1 or (grown[n]["bytes"] <= 0 and n not in SHARED_ADAPTERS)]
        written = now.get("l1_write_chunks", 0) - before.get("l1_write_chunks", 0)
        in_flight = now.get("l2_store_requests_submitted", 0) - sum(a.get("stores", 0) for a in now["l2"].values())
        pending = (
            [f"{expected - written} of {expected} new chunks not yet in LMCache's DRAM"] if written < expected else []
        )
        pending += [f"{in_flight} store task(s) still in flight"] if in_flight > 0 else []
        moving = (now.get("l1_write_chunks"), now.get("l2_store_requests_submitted"))
        settled = not pending and moving == previous
        if not expected:
            late, pending = [], []
        if not expected or (settled and not late) or time.monotonic() > deadline:
            return {"adapters": grown, "late": late, "pending": pending, "counters": now}
        previous = moving
        time.sleep(poll)


def _cold(replies: list, chunk_size: int) -> list:
    ok = [r for r in replies if not _failed([r])]
    return [r for r in ok if r["cached_tokens"] < cacheable_tokens(r["prompt_tokens"], chunk_size)]


def new_chunks(replies: list, chunk_size: int) -> int:
    """The whole chunks the answered prompts stored new: each prompt's, less those it found cached."""
    return sum(
        (whole_chunk_tokens(r["prompt_tokens"], chunk_size) - whole_chunk_tokens(r["cached_tokens"], chunk_size))
        // chunk_size
        for r in _cold(replies, chunk_size)
    )


def report(first: list, before: dict, stored: dict, chunk_size: int, seconds: float, again: list | None) -> dict:
    """The warmup's figures from its replies and counters (`stored` as wait_stored returns it)."""
    after = stored["counters"]
    cold = _cold(first, chunk_size)
    chunks = new_chunks(first, chunk_size)
    cacheable = sum(cacheable_tokens(r["prompt_tokens"], chunk_size) for r in first)
    result = {
        "prompts": len(first),
        "prompt_tokens": sum(r["prompt_tokens"] for r in first),
        "cacheable_tokens": cacheable,
        "already_cached_tokens": sum(r["cached_tokens"] for r in first),
        "new_prompts": len(cold),
        # Whole chunks are stored: a prompt's chunks less those it found cached.
        "chunks_stored": chunks,
        "tokens_stored": chunks * chunk_size,
        "failed": len(_failed(first)),
        "errors": sorted({r["error"][:200] for r in _failed(first)})[:3],
        "seconds": round(seconds, 3),
        "ttft": stats(r["ttft"] for r in first),
        "stored": {
            "l0_chunks": after["l1_write_chunks"] - before["l1_write_chunks"],
            "l0_bytes": after["l1_memory_usage_bytes"] - before["l1_memory_usage_bytes"],
            **stored["adapters"],
        },
        "stores_late": stored["late"],
        "stores_pending": stored.get("pending", []),
        "changed": bool(cold),
    }
    if again is not None:
        result["replay"] = {
            "hit_tokens": sum(r["cached_tokens"] for r in again),
            "cacheable_tokens": cacheable,
            "failed": len(_failed(again)),
            "ttft": stats(r["ttft"] for r in again),
        }
    return result


def warm(
    base: str,
    model: str,
    prompts: list,
    counters,
    persistent: list,
    chunk_size: int,
    concurrency: int = 4,
    store_timeout: float = 120.0,
    replay: bool = True,
    api_key: str = "",
) -> dict:
    """Send every prompt, wait until its new chunks reached the persistent tiers (`persistent`: the L2 adapter
    names of LMCache for kvtier's L2 and L3), then send them again: what was stored and what hits.

    ``changed`` is true when any prompt was not already cached in full (so new entries were stored); a corpus
    that is already warm leaves it false."""
    before = counters()
    started = time.monotonic()
    first = send_all(base, model, prompts, concurrency, api_key=api_key)
    seconds = time.monotonic() - started
    stored = wait_stored(counters, before, persistent, new_chunks(first, chunk_size), store_timeout)
    again = send_all(base, model, prompts, concurrency, api_key=api_key) if replay else None
    return report(first, before, stored, chunk_size, seconds, again)


def problems(result: dict, store_timeout: float) -> list:
    """What went wrong in a warmup, one line each ([] when it filled the tiers and its replay hit)."""
    found = []
    if result["failed"]:
        found.append(f"{result['failed']} of {result['prompts']} request(s) failed: {'; '.join(result['errors'])}")
    if result["stores_late"]:
        stored = result["stored"]
        seen = ", ".join(
            f"{name} {stored[name]['stores']} task(s) +{stored[name]['bytes']} bytes"
            for name in result["stores_late"]
            if name in stored
        )
        found.append(
            f"the new chunks did not reach {', '.join(result['stores_late'])} within {store_timeout:.0f} s "
            f"(LMCache's store counters or bytes did not grow: {seen or 'no counters'}; its DRAM took "
            f"{stored['l0_chunks']} chunk(s) for {result['chunks_stored']} new): "
            "check with kvtier health"
        )
    if result.get("stores_pending"):
        found.append(
            f"LMCache had not finished storing within {store_timeout:.0f} s: {'; '.join(result['stores_pending'])} "
            "(check with kvtier health)"
        )
    replay = result.get("replay")
    if replay and replay["cacheable_tokens"] and not replay["hit_tokens"]:
        found.append(
            f"the replay hit none of its {replay['cacheable_tokens']} cacheable tokens: the cache does not serve "
            "this corpus (check with kvtier health)"
        )
    return found
