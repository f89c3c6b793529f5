"""A steady stream of client requests against one OpenAI-compatible URL (the router), in a background thread:
what a user of the cluster sees while it is maintained. Every request is counted; a failure keeps its reason.

Requests cycle over a fixed set of prompts, so after the first cycle they hit the cache and write no new entries
(a persistence check running meanwhile counts the persistent tiers' objects).
"""

from __future__ import annotations

import statistics
import threading
import time

from kvtier.probes import warmup as warmup_probe


class Background:
    """step() every `interval` seconds in a daemon thread, for the duration of a `with` block."""

    def __init__(self, interval: float, join_timeout: float):
        self.interval, self.join_timeout = interval, join_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(self.join_timeout)


class ClientStream(Background):
    def __init__(
        self,
        base_url: str,
        model: str,
        prompts: list,
        interval: float = 0.5,
        timeout: float = 120.0,
        api_key: str = "",
    ):
        if not prompts:
            raise ValueError("a client stream needs at least one prompt")
        super().__init__(interval, timeout + 5)
        self.base_url, self.model, self.prompts, self.timeout = base_url, model, list(prompts), timeout
        self.api_key = api_key
        self.results: list = []  # {"at": epoch seconds, "ok", "status", "ttft", "seconds", "cached_tokens", "error"}

    def send(self, prompt: str) -> dict:
        reply = warmup_probe.stream_complete(self.base_url, self.model, prompt, self.timeout, api_key=self.api_key)
        return dict(reply, at=time.time(), ok=reply["status"] == 200 and not reply["error"])

    def warm(self) -> list:
        """Each prompt once, in the caller's thread (before the stream starts): the set is in the cache after."""
        return [self.send(p) for p in self.prompts]

    def step(self) -> None:
        self.results.append(self.send(self.prompts[len(self.results) % len(self.prompts)]))

    def summary(self) -> dict:
        return summarize(self.results)


def summarize(results: list) -> dict:
    """Requests, failures (with their first reasons), TTFT median/p95/worst and the whole request's worst time."""
    ttfts = sorted(r["ttft"] for r in results if r["ok"] and r["ttft"] is not None)
    failed = [r for r in results if not r["ok"]]

    def pct(q):
        return round(ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))], 3) if ttfts else None

    return {
        "requests": len(results),
        "failed": len(failed),
        "errors": sorted({f"{r['status'] or 'no answer'}: {r['error'][:120]}" for r in failed})[:5],
        "ttft_p50": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p95": pct(0.95),
        "ttft_max": round(ttfts[-1], 3) if ttfts else None,
        "seconds_max": round(max((r["seconds"] for r in results), default=0.0), 3),
    }
