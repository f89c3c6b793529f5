"""The lab's failing-load fault: LMCache's own fault_inject adapter on one Spark, and requests that must still succeed
with the answer the cold computation gives.

fault_inject (LMCache 0.5.6, `l2_adapters/fault_inject_l2_adapter.py`) wraps a real adapter, reports a key present at
lookup and fails the load of a stable share of keys: what a peer gone mid-transfer or an L3 file evicted under its
reader does. It is put first in the Spark's lookup order, over a directory of its own, by the lab's hand (an edit of
the unit that site.yml's next run undoes), so every DRAM miss on that Spark asks it first.

The same Spark's vLLM runs with kv_load_failure_policy "fail" meanwhile (the negative control): LMCache loads before it
answers vLLM's lookup and trims the hit at the first chunk that failed, so vLLM never learns of these failures and
no request fails even under "fail". kvtier's default, "recompute", is for a failure between that answer and vLLM's
retrieve, which fault_inject cannot make.
"""

from __future__ import annotations

import json

from kvtier.cluster.systemd import exec_word
from kvtier.lab.stages import StageFailed
from kvtier.probes import lmcache as lmcache_probe
from kvtier.proof import tiers

# Under the service user's home (mounted into the container route's services too).
DIRECTORY = "/var/lib/kvtier/fault-inject"
# A tenth of the chunks fail: most repeats load a prefix and recompute the rest.
RATE = 0.1
PROMPTS = 4


def adapter() -> dict:
    return {"type": "fault_inject", "inner": {"type": "fs", "base_path": DIRECTORY}, "rate": RATE, "seed": 7}


# How the vLLM unit carries the policy (inside the JSON of --kv-transfer-config, quoted for systemd).
POLICY = '\\"kv_load_failure_policy\\":\\"{}\\"'


def _edit(node, unit: str, old: str, new: str) -> None:
    text = node.run("cat", unit)
    if old not in text:
        raise StageFailed(f"{unit} does not hold {old!r}")
    node.run("tee", unit, stdin=text.replace(old, new, 1))


def inject(t, spark: str) -> str:
    """Put the fault_inject adapter first in `spark`'s LMCache unit and make its vLLM fail a failed load, both
    applied at their next start."""
    node = t.nodes[spark]
    owner = node.run("stat", "--format", "%u:%g", "/var/lib/kvtier").strip()
    node.run("install", "-d", "-m", "0700", "-o", owner.split(":")[0], "-g", owner.split(":")[1], DIRECTORY)
    word = exec_word(json.dumps(adapter(), sort_keys=True, separators=(",", ":")))
    lmcache, vllm = (f"/etc/systemd/system/{t.units[name]}" for name in ("lmcache", "vllm"))
    _edit(node, lmcache, " --l2-adapter ", f" --l2-adapter {word} --l2-adapter ")
    _edit(node, vllm, POLICY.format("recompute"), POLICY.format("fail"))
    node.run("systemctl", "daemon-reload")
    return f"fault_inject first, failing {RATE:.0%} of its loads, vLLM's kv_load_failure_policy fail"


def served(out, t, spark: str) -> str:
    """PROMPTS new prompts on `spark`, each computed cold, stored, dropped from DRAM and sent again: every repeat
    succeeds with the cold answer, and LMCache counted failed loads (the injection happened)."""
    proof = tiers.Proof(t, out=out)
    before = proof.counters(spark)
    cached, full, wrong = [], [], []
    for index in range(PROMPTS):
        prompt = proof.prompt(spark, f"failing loads {index}")
        cold, stored_from, _ = proof.measured(spark, prompt)
        proof.wait_stored(spark, stored_from)
        proof.clear_dram(spark)
        try:
            hit = proof.complete(spark, prompt)
        except tiers.ProofError as exc:
            raise StageFailed(f"{spark}: a request whose loads failed was not answered: {exc}") from None
        difference = lmcache_probe.answer_difference(cold, hit)
        if difference:
            wrong.append(difference)
        cached.append(hit["cached_tokens"])
        full.append(cold["prompt_tokens"])
    after = proof.counters(spark)
    failures = after["l2_prefetch_failures"] - before["l2_prefetch_failures"]
    loads = after["l2"].get("fault_inject", {}).get("loads", 0) - before["l2"].get("fault_inject", {}).get("loads", 0)
    out(f"  {spark}: {loads} load(s) from fault_inject, {failures} chunk load(s) failed; cached {cached} of {full}")
    if wrong:
        raise StageFailed(f"{spark}: a repeat answered differently from its cold computation: {wrong[0]}")
    if failures <= 0:
        raise StageFailed(f"{spark}: no chunk load failed, so the injection was not exercised ({loads} loads)")
    return (
        f"{PROMPTS} repeats with {failures} failed chunk loads under kv_load_failure_policy fail: 0 failed requests, "
        f"every answer the cold one, cached {sum(cached)} of {sum(full)} tokens (LMCache trimmed each hit at its first "
        f"failed chunk; the rest recomputed)"
    )
