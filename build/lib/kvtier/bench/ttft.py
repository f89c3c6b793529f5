"""Time to first token, cold and from each tier, measured with streamed requests on a Spark.

Three sweeps, each request timed at its first streamed token and checked against LMCache's counters:
  context   at each context size, a new prompt (cold), then the same prompt again (an L0 hit);
  hit rate  at the longest size, a prompt whose first share (0-100 %, in whole chunks) was sent before, so the
            request loads that share from L0 and computes the rest;
  tiers     at each size, the same prompt served from L0, L2 and L3 by emptying the tiers above it, and a prompt
            computed on another Spark served over L1 (P2P). These steps empty tiers (tiers.DISRUPTIVE): lab only,
            or with --disruptive.
Requests run on the Spark itself (like the tier proof), so the figures hold the node's time, not the controller's
network. Each point is measured `iterations` times with new prompts: median and p95 are reported.
"""

from __future__ import annotations

import secrets
import time

from kvtier.nodes import transport as nodes
from kvtier.nodes.scripts import script
from kvtier.nodes.target import Target
from kvtier.nodes.transport import NodeError
from kvtier.probes import cpu as cpu_probe
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import warmup as warmup_probe
from kvtier.proof import tiers as proof_tiers

SOURCE = script(lmcache_probe, warmup_probe, cpu_probe)
SWEEPS = ("context", "hit_rate", "tiers")
# The series of a TTFT-vs-context plot, in the order a reader compares them.
SERIES = ("cold", "hit", "l0", "l1", "l2", "l3")
# "hit": a hit seen from outside (--endpoint), where no counter says which tier served it.
SERIES_NAMES = {"cold": "cold (no cache)", "hit": "cache hit (tier unknown)", **proof_tiers.TIER_NAMES}
DEFAULT_RATES = (0, 25, 50, 75, 100)


class BenchError(Exception):
    pass


class TtftBench:
    def __init__(self, target: Target, out=print, iterations: int = 3):
        self.t, self.out, self.iterations = target, out, iterations
        self.proof = proof_tiers.Proof(target, out=out)  # its steps empty tiers (clear DRAM, flush L2, L3 files)
        self.nonce = secrets.token_hex(4)
        self.chunk = target.spec.lmcache.chunk_size
        self.model = target.model

    # --- on the node ------------------------------------------------------------------------------------------
    def _node(self, host: str):
        return self.t.nodes[host]

    def _url(self, host: str) -> str:
        return self.t.vllm_url(host)

    def _api_key_expr(self) -> str:
        """The key a request to vLLM carries, as an expression evaluated on the node: the node's own."""
        return "node_api_key()"

    def _call(self, host: str, expression: str, timeout: float = 900):
        try:
            return self._node(host).python(SOURCE, expression, timeout=timeout)
        except (NodeError, ValueError) as exc:
            raise BenchError(f"{host}: {exc}") from None

    def machine(self, host: str) -> dict:
        return self._call(host, "machine()")

    def prompt(self, host: str, tokens: int, purpose: str) -> list:
        """A new document of exactly `tokens` tokens (the tag makes its chunks its own)."""
        entry = [{"tokens": tokens, "id": f"{self.nonce} {purpose}"}]
        call = (
            f"corpus_prompts({self._url(host)!r}, {self.model!r}, {entry!r}, {proof_tiers.TEXT!r}, 'kvtier bench')[0]"
        )
        return self._call(host, call)

    def request(self, host: str, prompt: list) -> dict:
        call = f"stream_complete({self._url(host)!r}, {self.model!r}, {prompt!r}, api_key={self._api_key_expr()})"
        reply = self._call(host, call)
        if reply["status"] != 200 or reply["error"]:
            raise BenchError(f"{host}: vLLM answered {reply['status'] or 'nothing'}: {reply['error'][:200]}")
        return reply

    def counters(self, host: str) -> dict:
        return self.proof.counters(host)

    def cold_then_stored(self, host: str, prompt: list) -> dict:
        """The prompt's first request, once its chunks reached every persistent tier."""
        before = self.counters(host)
        reply = self.request(host, prompt)
        if reply["cached_tokens"]:
            raise BenchError(f"{host}: a new prompt already had {reply['cached_tokens']} cached tokens")
        self.proof.wait_stored(host, before)
        return reply

    def _point(self, sweep, host, reply, tier, **extra) -> dict:
        return {
            "sweep": sweep,
            "host": host,
            "tier": tier,
            "ttft": reply["ttft"],
            "seconds": reply["seconds"],
            "prompt_tokens": reply["prompt_tokens"],
            "cached_tokens": reply["cached_tokens"],
            **extra,
        }

    # --- the sweeps -------------------------------------------------------------------------------------------
    def context(self, host: str, sizes: list) -> list:
        points = []
        for size in sizes:
            for i in range(self.iterations):
                prompt = self.prompt(host, size, f"context {size} #{i}")
                cold = self.cold_then_stored(host, prompt)
                hit = self.request(host, prompt)
                points.append(self._point("context", host, cold, "cold", context=size, iteration=i))
                points.append(self._point("context", host, hit, "l0", context=size, iteration=i))
            self.out(f"  {host} context {size}: {_medians(points, size)}")
        return points

    def hit_rate(self, host: str, size: int, rates=DEFAULT_RATES) -> list:
        cacheable = warmup_probe.cacheable_tokens(size, self.chunk)
        whole = warmup_probe.whole_chunk_tokens(size, self.chunk)
        points = []
        for rate in rates:
            for i in range(self.iterations):
                prompt = self.prompt(host, size, f"hit rate {rate} #{i}")
                cached = warmup_probe.whole_chunk_tokens(whole * rate // 100, self.chunk)
                if cached:
                    # One token past the share, so the request that stores it stores all of its whole chunks.
                    self.cold_then_stored(host, prompt[: min(cached + 1, size)])
                reply = self.request(host, prompt)
                points.append(
                    self._point(
                        "hit_rate",
                        host,
                        reply,
                        "l0" if cached else "cold",
                        context=size,
                        iteration=i,
                        rate=rate,
                        measured_rate=round(reply["cached_tokens"] / cacheable * 100, 1) if cacheable else 0.0,
                    )
                )
            ttft = warmup_probe.percentile([p["ttft"] for p in points if p["rate"] == rate], 50)
            self.out(f"  {host} hit rate {rate} % of {size} tokens: TTFT p50 {ttft:.3f} s")
        return points

    def tiers(self, host: str, sizes: list) -> list:
        """Each size from L0, L2, L3 (emptying the tiers above), and L1 from another Spark."""
        spec = self.t.spec
        others = [h for h in self.t.nodes if h != host]
        points = []
        for size in sizes:
            for i in range(self.iterations):
                marker = self.proof.l3_marker_if_needed(host, i, ("l2", "l3"))
                prompt = self.prompt(host, size, f"tiers {size} #{i}")
                cold = self.cold_then_stored(host, prompt)
                points.append(self._point("tiers", host, cold, "cold", context=size, iteration=i))
                points.append(self._tier(host, prompt, "l0", size, i))
                # Each lower tier in LMCache's load order, with DRAM and the tiers looked up before it emptied.
                for tier, adapter in self.t.lower_tiers:
                    self.proof.clear_dram(host)
                    self.proof.empty_before(host, tier, marker)
                    points.append(self._tier(host, prompt, tier, size, i, adapter))
                if marker is not None:
                    self._node(host).run("rm", "-f", marker)
                if spec.has("l1_p2p") and others:
                    points.append(self._peer(others[0], host, size, i))
            self.out(f"  {host} tiers at {size}: {_medians(points, size)}")
        return points

    def _tier(self, host, prompt, tier, size, i, adapter=None) -> dict:
        before = self.counters(host)
        reply = self.request(host, prompt)
        after = self.counters(host)
        if adapter:
            moved = proof_tiers.loads(after, adapter) - proof_tiers.loads(before, adapter)
        else:
            moved = after["l1_hit_tokens"] - before["l1_hit_tokens"]
        return self._point("tiers", host, reply, tier, context=size, iteration=i, counter_moved=moved)

    def _peer(self, source_host, host, size, i) -> dict:
        """A prompt computed on `source_host`, with its L2 entries and L3 files removed, served on `host`."""
        marker = self.proof.l3_marker(source_host, i) if self.t.spec.has("l3") else None
        prompt = self.prompt(source_host, size, f"peer {size} #{i}")
        self.cold_then_stored(source_host, prompt)
        if self.t.spec.has("l2"):
            self.proof.flush_l2(source_host)
        if marker:
            self.proof.remove_l3_since(source_host, marker)
        point = self._tier(host, prompt, "l1", size, i, "p2p")
        point["source"] = source_host
        return point

    def wait_ready(self, host: str) -> None:
        self.proof.wait_ready(host)

    def run(self, host: str, sizes: list, sweeps=SWEEPS, rates=DEFAULT_RATES) -> dict:
        self.wait_ready(host)
        started = time.time()
        points = []
        if "context" in sweeps:
            points += self.context(host, sizes)
        if "hit_rate" in sweeps:
            points += self.hit_rate(host, max(sizes), rates)
        if "tiers" in sweeps:
            points += self.tiers(host, sizes)
        return {
            "host": host,
            "model": self.model,
            "chunk_size": self.chunk,
            "sizes": sizes,
            "iterations": self.iterations,
            "started": started,
            "machine": self.machine(host),
            "points": points,
            "summary": summarize(points),
        }


class EndpointBench(TtftBench):
    """`--endpoint URL`: requests from the controller to whatever serves the URL (one Spark, or a router in front
    of several), as a client sees it. LMCache's counters live on the nodes, so: the context and hit-rate sweeps
    only, hits from vLLM's usage (cached_tokens), and a pause of SETTLE seconds after a prompt's first request for
    its store (on a node, the bench waits for the counters instead)."""

    SETTLE = 1.0

    def __init__(
        self, url: str, chunk_size: int, out=print, iterations: int = 3, model: str | None = None, api_key: str = ""
    ):
        self.url, self.out, self.iterations, self.chunk = url.rstrip("/"), out, iterations, chunk_size
        self.api_key = api_key
        self.nonce = secrets.token_hex(4)
        self.node = nodes.local("controller")
        self.model = model or self._served()

    def _served(self) -> str:
        try:
            served = lmcache_probe.served_models(lmcache_probe.get_json(self.url + "/v1/models", api_key=self.api_key))
        except lmcache_probe.ProbeError as exc:
            raise BenchError(str(exc)) from None
        if not served:
            raise BenchError(f"{self.url}/v1/models lists no model")
        return served[0]

    def _node(self, host: str):
        return self.node

    def _api_key_expr(self) -> str:
        return repr(self.api_key)  # read by the controller's own python3 on its standard input, never an argument

    def _url(self, host: str) -> str:
        return self.url

    def wait_ready(self, host: str) -> None:
        pass  # a client measures what answers; /v1/models answered already

    def cold_then_stored(self, host: str, prompt: list) -> dict:
        reply = self.request(host, prompt)
        time.sleep(self.SETTLE)
        return reply

    def _point(self, sweep, host, reply, tier, **extra) -> dict:
        # Behind a router the repeat may land on another Spark: a hit, from a tier no counter names here.
        return super()._point(sweep, host, reply, "hit" if tier == "l0" else tier, **extra)

    def run(self, host: str, sizes: list, sweeps=SWEEPS, rates=DEFAULT_RATES) -> dict:
        if "tiers" in sweeps:
            raise BenchError("the tiers sweep empties tiers on the nodes: it needs -i INVENTORY, not --endpoint")
        result = super().run(host, sizes, sweeps, rates)
        result["machine"] = dict(result["machine"], measured_from="the controller (a client of the endpoint)")
        return result


def summarize(points: list) -> list:
    """Median and p95 TTFT per (sweep, tier, context, rate), with the hit tokens and the ratio to cold."""
    groups: dict = {}
    for p in points:
        groups.setdefault((p["sweep"], p["tier"], p["context"], p.get("rate")), []).append(p)
    cold = {
        (sweep, context): warmup_probe.percentile([p["ttft"] for p in ps], 50)
        for (sweep, tier, context, _), ps in groups.items()
        if tier == "cold" and sweep != "hit_rate"
    }
    rows = []
    for (sweep, tier, context, rate), ps in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        ttft = warmup_probe.stats(p["ttft"] for p in ps)
        base = cold.get((sweep, context))
        rows.append(
            {
                "sweep": sweep,
                "tier": tier,
                "context": context,
                "rate": rate,
                "n": ttft["count"],
                "ttft_p50": ttft["p50"],
                "ttft_p95": ttft["p95"],
                "cached_tokens": round(sum(p["cached_tokens"] for p in ps) / len(ps)),
                "vs_cold": round(ttft["p50"] / base, 3) if base and ttft["p50"] is not None else None,
                "counter_moved": min((p["counter_moved"] for p in ps if "counter_moved" in p), default=None),
            }
        )
    return rows


def measured_load_order(results: list) -> dict | None:
    """What `kvtier_cluster.load_order.measured_s` takes from a tiers sweep: each lower tier's median TTFT at the
    longest context measured (over every Spark benched); None without a tiers sweep of both lower tiers."""
    rows = [r for result in results for r in result["summary"] if r["sweep"] == "tiers"]
    if not rows:
        return None
    longest = max(r["context"] for r in rows)
    times: dict = {}
    for r in rows:
        if r["context"] == longest and r["tier"] in ("l0", "l2", "l3") and r["ttft_p50"] is not None:
            times.setdefault(r["tier"], []).append(r["ttft_p50"])
    if not {"l2", "l3"} <= set(times):
        return None
    return {tier: round(warmup_probe.percentile(values, 50), 4) for tier, values in sorted(times.items())}


def _order(key):
    sweep, tier, context, rate = key
    return (SWEEPS.index(sweep), context, rate if rate is not None else -1, SERIES.index(tier))


def _medians(points: list, size: int) -> str:
    shown = []
    for tier in SERIES:
        values = [p["ttft"] for p in points if p["context"] == size and p["tier"] == tier and p["sweep"] != "hit_rate"]
        if values:
            shown.append(f"{tier} {warmup_probe.percentile(values, 50):.3f} s")
    return ", ".join(shown)


def plots(results: list) -> list:
    """TTFT against context per tier (the tiers sweep where it ran, else cold vs L0), and against hit rate."""
    by_context: dict = {}
    by_rate: dict = {}
    for result in results:
        prefix = f"{result['host']} " if len(results) > 1 else ""
        rows = result["summary"]
        sweep = "tiers" if any(r["sweep"] == "tiers" for r in rows) else "context"
        for r in rows:
            point = (r["rate"] if r["sweep"] == "hit_rate" else r["context"], r["ttft_p50"], r["ttft_p95"])
            if r["sweep"] == sweep:
                by_context.setdefault(prefix + SERIES_NAMES[r["tier"]], []).append(point)
            elif r["sweep"] == "hit_rate":
                by_rate.setdefault(f"{prefix}{r['context']} tokens", []).append(point)
    panels = [
        {
            "title": "TTFT against context (median, p95 bar)",
            "xlabel": "context (tokens)",
            "ylabel": "time to first token (s)",
            "series": by_context,
        }
    ]
    if by_rate:
        panels.append(
            {
                "title": "TTFT against cache hit rate (from L0)",
                "xlabel": "share of the prompt cached (%)",
                "ylabel": "time to first token (s)",
                "series": by_rate,
            }
        )
    return panels


def table(results: list) -> list:
    lines = [
        f"{'host':<10} {'sweep':<9} {'tier':<5} {'context':>7} {'rate':>5} {'n':>3} {'p50 s':>8} {'p95 s':>8} "
        f"{'cached':>7} {'vs cold':>8}"
    ]
    for result in results:
        for r in result["summary"]:
            rate = "" if r["rate"] is None else r["rate"]
            vs = "" if r["vs_cold"] is None else f"{r['vs_cold']:.2f}x"
            lines.append(
                f"{result['host']:<10} {r['sweep']:<9} {r['tier']:<5} {r['context']:>7} {rate:>5} {r['n']:>3} "
                f"{r['ttft_p50']:>8.3f} {r['ttft_p95']:>8.3f} {r['cached_tokens']:>7} {vs:>8}"
            )
    return lines
