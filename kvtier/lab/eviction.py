"""The L3 evictor under load: the lab's L3 pool, given a small budget, fills past its high watermark while a client
streams through the router; the evictor brings it back under the watermarks run after run, least recently used
chunks first, the prompts used last still hit, no request fails, and health shows the fill against the budget. The
budget goes back to its setting after."""

from __future__ import annotations

import re
import time

from kvtier.bench.stream import summarize
from kvtier.health import checks as health_checks
from kvtier.lab.day2 import under_client_stream
from kvtier.lab.inventory import INVENTORY, REPO, STORAGE_DATA_ADDRESS, proof_target
from kvtier.lab.stages import StageFailed
from kvtier.lab.strategy import run_playbook
from kvtier.probes import health_l3
from kvtier.proof import tiers

# Where the lab's evictor runs (inventory/lab: kvtier_l3_evictor_node) and what it writes.
HOST = "spark01"
TEXTFILE = "/var/lib/prometheus/node-exporter/kvtier-l3.prom"
UNIT = "kvtier-l3-evictor.service"
# The stage's settings: a budget a few prompts overflow, a run every few seconds.
HIGH, LOW = 0.9, 0.6
INTERVAL = "3s"
MIN_AGE_S = 1
# New prompts sent to each Spark while the client streams (each stores its chunks to L3).
FILL_PROMPTS = 12
# The budget: this share of what the pool holds when the stage starts (the first run then evicts at once), and at
# least what the fill overflows several times over, so that chunks
# younger than the minimum age cannot hold the pool over its high watermark on their own.
BUDGET_SHARE = 0.8
BUDGET_FLOOR = 32 * 2**20


def metrics(node) -> dict:
    """The evictor's last run, from its textfile: {metric name: value}."""
    text = node.run("cat", TEXTFILE)
    return {m[1]: float(m[2]) for m in re.finditer(r"^(kvtier_l3_\w+) (\S+)$", text, re.M)}


def _configure(out, extravars: dict) -> None:
    ok, _, _, failures = run_playbook(REPO, "l3_evictor.yml", INVENTORY, out=lambda _: None, extravars=extravars)
    if not ok:
        raise StageFailed("l3_evictor.yml: " + ("; ".join(failures) or "failed"))


def _wait_run(node, after: float, timeout: float = 60) -> dict:
    """The first evictor run that ended after `after` (epoch seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = metrics(node)
        if seen.get("kvtier_l3_evictor_last_run_timestamp_seconds", 0) > after:
            return seen
        time.sleep(1)
    raise StageFailed(f"the L3 evictor on {HOST} has not run within {timeout:.0f} s")


def fill_past_the_watermark(out) -> str:
    t = proof_target()
    node = t.nodes[HOST]
    start = _wait_run(node, 0)
    held = start["kvtier_l3_used_bytes"]
    removed_before = start.get("kvtier_l3_evicted_chunks_total", 0)
    budget = max(int(held * BUDGET_SHARE), BUDGET_FLOOR)
    out(f"  {HOST}: the pool holds {held / 2**20:.1f} MiB; budget for this stage {budget / 2**20:.1f} MiB")
    _configure(
        out,
        {
            "l3_evictor_budget_bytes": budget,
            "l3_evictor_high_watermark": HIGH,
            "l3_evictor_low_watermark": LOW,
            "l3_evictor_interval": INTERVAL,
            "l3_evictor_min_age_s": MIN_AGE_S,
        },
    )
    runs, last_prompts, hits, seen = {}, {}, {}, []  # runs: the evictor's runs seen, by when they ended
    final = start
    try:
        proof = tiers.Proof(t, out=out)
        began = time.time()
        node.run("systemctl", "start", UNIT)  # the first run now, not when the restarted timer gets to it
        first = metrics(node)  # the run just ended: the pool was over its high watermark from the start
        runs[first["kvtier_l3_evictor_last_run_timestamp_seconds"]] = first
        with under_client_stream(out, STORAGE_DATA_ADDRESS, t.model) as (stream, _):
            for round_ in range(FILL_PROMPTS):
                for spark in t.nodes:
                    last_prompts[spark] = proof.prompt(spark, f"eviction fill {round_}")
                    proof.complete(spark, last_prompts[spark])
                seen = metrics(node)
                if seen["kvtier_l3_evictor_last_run_timestamp_seconds"] > began:
                    runs[seen["kvtier_l3_evictor_last_run_timestamp_seconds"]] = seen
            final = _wait_run(node, time.time())
            runs[final["kvtier_l3_evictor_last_run_timestamp_seconds"]] = final
            # The prompts sent last, again: each still hits.
            for spark, prompt in last_prompts.items():
                _, before, after = proof.measured(spark, prompt)
                hits[spark] = after["hit_tokens"] - before["hit_tokens"]
        client = summarize(stream.results)  # the stream has stopped: every request it sent is in
        # Health's view of the pool: a run after every chunk is old enough to go, then the evictor's check.
        _wait_run(node, time.time() + MIN_AGE_S)
        seen = [c for c in health_checks.run(t)[0] if c["check"] == "evictor"]
        for c in seen:
            out(f"  health: {c['host']} {c['status']} {c['code']}: {c['reason']}")
    finally:
        _configure(out, {})  # the inventory's settings again
    # The counter, not the runs seen: a run that evicted may have ended between two reads (or while the playbook
    # restarted the timer with the stage's budget).
    removed = final["kvtier_l3_evicted_chunks_total"] - removed_before
    over = [r for r in runs.values() if r["kvtier_l3_used_bytes"] > HIGH * budget]
    peak = max((r["kvtier_l3_used_bytes"] for r in runs.values()), default=0)
    out(
        f"  {len(runs)} evictor runs seen, {removed:.0f} chunks removed in all; after each run seen at most "
        f"{peak / 2**20:.1f} MiB (high {HIGH * budget / 2**20:.1f}, low {LOW * budget / 2**20:.1f} MiB)"
    )
    out("  the prompts sent last, again: " + ", ".join(f"{s} {n} hit tokens" for s, n in hits.items()))
    out(f"  client: {client['requests']} requests, {client['failed']} failed; TTFT p95 {client['ttft_p95']} s")
    if client["failed"]:
        raise StageFailed(f"{client['failed']} client request(s) failed while the evictor ran: {client['errors']}")
    if not removed:
        raise StageFailed("the evictor removed no chunk although the pool was over its high watermark")
    if over:
        raise StageFailed(f"after {len(over)} run(s) the pool was still over its high watermark: {over[-1]}")
    budget_said = f"of its {health_l3.size_text(budget)} budget"
    if [(c["host"], c["code"]) for c in seen] != [(HOST, "L3_EVICTOR_OK")] or budget_said not in seen[0]["reason"]:
        raise StageFailed(f"health does not show the pool under the stage's budget on {HOST}: {seen}")
    missed = [s for s, n in hits.items() if n <= 0]
    if missed:
        raise StageFailed(f"the prompts used last no longer hit on {missed}")
    return (
        f"budget {budget / 2**20:.1f} MiB ({held / 2**20:.1f} MiB held); {removed:.0f} chunks removed, the pool at "
        f"most {peak / 2**20:.1f} MiB after each of {len(runs)} runs seen; {client['requests']} client requests, "
        "0 failed; the last prompts still hit; health: L3_EVICTOR_OK"
    )
