"""The tier proof: on one Spark, a request that can only be served by one tier, and the counter that shows it.

Every hit is read from LMCache's per-tier counters (``lmcache_mp_*``), never inferred from timing:
  L0 local DRAM  the prompt again: LMCache's DRAM (its "L1") hit tokens rise;
  L2 remote      the node's DRAM emptied (``lmcache kvcache clear``): the repeat loads through the L2 adapter
                 (LMCache's ``resp``/``valkey`` "L2 adapter" on the storage node);
  L3 NVMe pool   L2 emptied and LMCache restarted (vLLM follows it): the repeat loads through the ``fs`` adapter;
  L1 peer        a prompt computed on another Spark, with L2 and this run's L3 entries removed: the ``p2p`` adapter.
LMCache looks a prompt up in its DRAM, then in its L2 adapters in order (L2, L3, then the peers it adds at run
time), so a lower tier can only be shown by emptying the ones before it. Those steps disturb a serving
cluster (DISRUPTIVE says how); they run only where the caller allows them (the lab, or an operator's
explicit --disruptive). The L0 proof never disturbs anything.

Every probe runs on the node (its LMCache API listens on loopback only) as standard-library Python, the same
probe code the Ansible modules use.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import time

from kvtier.cluster import render
from kvtier.nodes.scripts import script
from kvtier.nodes.target import Target
from kvtier.nodes.transport import NodeError
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import resp as resp_probe

TIERS = ("l0", "l1", "l2", "l3")
TIER_NAMES = {"l0": "L0 local DRAM", "l1": "L1 peer (P2P)", "l2": "L2 remote memory", "l3": "L3 NVMe pool"}
# The spec's tier names (kvtier_cluster.tiers) for each proof.
SPEC_TIER = {"l0": "l0", "l1": "l1_p2p", "l2": "l2", "l3": "l3"}
DISRUPTIVE = {
    "l2": "empties the node's LMCache DRAM (lmcache kvcache clear): its next requests miss there",
    "l3": "flushes the whole L2 store (FLUSHALL) and restarts the node's LMCache and vLLM: an outage of that node",
    "l1": "flushes the whole L2 store (FLUSHALL) and deletes the L3 files written during the proof",
}
TEXT = "/usr/share/common-licenses/GPL-3"  # on every Debian and Ubuntu host: a long, stable prompt body
_LMCACHE = script(lmcache_probe)
_RESP = script(resp_probe)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SOURCE = re.compile(r"\s*\([\w./]+\.py:\d+:[\w.]+\)$")  # LMCache ends each line with (file.py:line:module)


class ProofError(Exception):
    """The proof could not be carried out (as opposed to a tier that was not proven)."""


class EngineFailed(ProofError):
    """vLLM answered a request with a server error: its engine died under it (systemd restarts the unit)."""

    def __init__(self, host: str, message: str):
        super().__init__(message)
        self.host = host


@dataclasses.dataclass
class Hit:
    tier: str  # l0, l1, l2, l3
    host: str
    cached_tokens: int
    prompt_tokens: int
    counter: str  # the LMCache counter that must move
    delta: int
    seconds: float  # this request
    cold_seconds: float  # the same prompt's first request (a miss)
    source: str = ""  # for l1: the Spark that computed the prompt
    attempt: int = 1
    why: str = ""  # what LMCache said when the tier was not proven
    wrong_answer: str = ""  # how the hit's greedy answer differs from the cold computation's ("" when the same)
    also_loaded: str = ""  # lower tiers looked up after this one that loaded it too (it was not the first to serve)

    @property
    def proven(self) -> bool:
        return self.cached_tokens > 0 and self.delta > 0 and not self.wrong_answer and not self.also_loaded

    @property
    def label(self) -> str:
        return TIER_NAMES[self.tier] + (f" from {self.source}" if self.source else "")

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), proven=self.proven, label=self.label)


def refused(tiers, allow_disruptive: bool) -> list:
    """Why the requested tiers cannot be proven here, one line each ([] when they can)."""
    if allow_disruptive:
        return []
    return [f"proving {TIER_NAMES[t]} {DISRUPTIVE[t]}; pass --disruptive to allow it" for t in tiers if t in DISRUPTIVE]


class Proof:
    """The tier proof against one cluster. Each call of a proof uses prompts no tier has seen."""

    def __init__(self, target: Target, out=print, ready_timeout: float = 900):
        self.t = target
        self.out = out
        self.ready_timeout = ready_timeout
        # The run's nonce makes its prompts new to every tier: L3 and P2P outlive a run.
        self.nonce = secrets.token_hex(4)

    # --- probes on a node ---------------------------------------------------------------------------------
    def counters(self, host: str) -> dict:
        url = self.t.lmcache_url(host) + "/metrics"
        return self.t.nodes[host].python(_LMCACHE, f"lmcache_summary(get_metrics({url!r}))")

    def wait_ready(self, host: str) -> None:
        peers = render.p2p_peers(self.t.spec)
        endpoints = {"vllm": self.t.vllm_url(host), "lmcache_http": self.t.lmcache_url(host)}
        deadline = time.monotonic() + self.ready_timeout
        while True:
            result = self.t.nodes[host].python(_LMCACHE, f"probe_node({endpoints!r}, {self.t.model!r}, 5.0, {peers!r})")
            if not result["problems"]:
                return
            if time.monotonic() > deadline:
                raise ProofError(f"{host} not ready after {self.ready_timeout:.0f} s: {'; '.join(result['problems'])}")
            time.sleep(3)

    def complete(self, host: str, prompt: str) -> dict:
        """Send the prompt to the Spark's vLLM (from the node itself); its answer, or ProofError."""
        call = f"complete({self.t.vllm_url(host)!r}, {self.t.model!r}, {prompt!r}, 600.0, '', ANSWER_TOKENS)"
        reply = self.t.nodes[host].python(_LMCACHE, call, timeout=660)
        if reply["status"] == 200:
            return reply
        message = (
            f"{host}: vLLM answered {reply['status'] or 'nothing'}: {reply['error'][:200]}; {self.vllm_errors(host)}"
        )
        raise EngineFailed(host, message) if reply["status"] >= 500 else ProofError(message)

    def measured(self, host: str, prompt: str) -> tuple:
        """(vLLM's answer, counters before, counters after) of one request."""
        before = self.counters(host)
        reply = self.complete(host, prompt)
        return reply, before, self.counters(host)

    def wait_stored(self, host: str, before: dict, timeout: float = 120) -> None:
        """Stores are asynchronous: wait until each persistent adapter completed one more than before."""
        adapters = [a for a in (self.t.l2_name, self.t.l3_name) if a]
        deadline = time.monotonic() + timeout
        while True:
            now = self.counters(host)
            late = [a for a in adapters if _stores(now, a) <= _stores(before, a)]
            if not late:
                return
            if time.monotonic() > deadline:
                raise ProofError(f"{host}: no store completed on {', '.join(late)} within {timeout:.0f} s")
            time.sleep(1)

    def journal(self, host: str, unit: str, *selection: str) -> str:
        return self.t.nodes[host].run("journalctl", "--unit", unit, *selection, "--output", "cat", "--no-pager")

    def vllm_errors(self, host: str, keep: int = 3) -> str:
        """The last lines of vLLM's journal that say why a request failed."""
        try:
            log = self.journal(host, self.t.units["vllm"], "--lines", "500")
        except NodeError as exc:
            return f"its journal could not be read ({exc})"
        errors = [
            line.strip() for line in log.splitlines() if "ERROR " in line and ("died" in line or "Error:" in line)
        ]
        return " | ".join(errors[-keep:]) or f"see `journalctl -u {self.t.units['vllm']}` on {host}"

    def lmcache_warnings(self, host: str, since: float, keep: int | None = 4) -> list:
        """LMCache's own warnings and errors since `since` (epoch seconds): a peer lookup that timed out or a
        transfer that failed is only said there; the request itself just reports fewer cached tokens."""
        log = self.journal(host, self.t.units["lmcache"], "--since", f"@{since:.0f}")
        said = []
        for line in log.splitlines():
            line = _ANSI.sub("", line)  # LMCache colours its log even when it goes to the journal
            if "LMCache WARNING" in line or "LMCache ERROR" in line:
                said.append(_SOURCE.sub("", line.split("LMCache ", 1)[1]).strip())
        return said if keep is None else said[-keep:]

    def p2p_view(self, host: str) -> str:
        """How a Spark's LMCache sees its peers right now (from /status)."""
        url = self.t.lmcache_url(host) + "/status"
        status = self.t.nodes[host].python(_LMCACHE, f"status_summary(get_json({url!r}))")
        return f"P2P {status['p2p_state']}, peers {', '.join(status['p2p_peers']) or 'none'}"

    # --- the steps that disturb a serving cluster --------------------------------------------------------
    def clear_dram(self, host: str) -> None:
        self.t.nodes[host].python(_LMCACHE, f"clear_dram({self.t.lmcache_url(host)!r})")

    def flush_l2(self, via: str) -> None:
        """FLUSHALL as the L2 admin user, from a Spark (it reaches the L2 server on the data network)."""
        if not self.t.l2_admin_password:
            raise ProofError("emptying L2 needs the L2 admin password (kv_store_admin_password in the inventory)")
        l2 = self.t.spec.l2
        call = f"flush_all({l2.host!r}, {l2.port!r}, {self.t.l2_admin_user!r}, {self.t.l2_admin_password!r})"
        self.t.nodes[via].python(_RESP, call, timeout=60)

    def l3_marker(self, host: str, attempt: int) -> str:
        """A file in the L3 directory: its time comes from the same filesystem clock as the entries'."""
        marker = f"{self.t.spec.l3.path}/.kvtier-proof-{self.nonce}-{attempt}"
        self.t.nodes[host].run("touch", marker)
        return marker

    def remove_l3_since(self, host: str, marker: str) -> None:
        """Delete the L3 files written after `marker`, then the marker."""
        path = self.t.spec.l3.path
        # Chunks only (the top level): the nodes' temp files being written sit in their sub-directories.
        top_level = ("-mindepth", "1", "-maxdepth", "1", "-type", "f")
        self.t.nodes[host].run("find", path, *top_level, "-newer", marker, "-delete")
        self.t.nodes[host].run("rm", "-f", marker)

    def restart_lmcache(self, host: str) -> None:
        # The unit binds vLLM to it: vLLM stops with it and starts again once it is back.
        self.t.nodes[host].run("systemctl", "restart", self.t.units["lmcache"])
        self.wait_ready(host)

    # --- the proofs ---------------------------------------------------------------------------------------
    def prompt(self, host: str, purpose: str) -> str:
        # The purpose and host come first, so no chunk is shared with another proof's prompt.
        text = self.t.nodes[host].run("head", "-c", "6000", TEXT)
        return f"kvtier proof {self.nonce} {purpose} on {host}: {text}"

    def empty_before(self, host: str, tier: str, marker: str | None) -> None:
        """Empty the lower tiers LMCache looks in before `tier` (L2 flushed, L3 files written after `marker`
        removed), so that the next load of the prompt can only come from `tier`."""
        for earlier, _ in self.t.lower_tiers[: [t for t, _ in self.t.lower_tiers].index(tier)]:
            if earlier == "l2":
                self.flush_l2(host)
            elif marker is not None:
                self.remove_l3_since(host, marker)

    def l3_marker_if_needed(self, host: str, attempt: int, tiers) -> str | None:
        """A marker when L3 must be emptied to prove a tier LMCache looks in after it."""
        order = [t for t, _ in self.t.lower_tiers if t in tiers]
        return self.l3_marker(host, attempt) if "l3" in order[:-1] else None

    def local(self, host: str, tiers=("l0", "l2", "l3"), attempt: int = 1) -> list:
        """L0 and the lower tiers asked for on one Spark, with one prompt: each lower tier in LMCache's load order,
        with DRAM and the tiers looked up before it emptied (L3 after an LMCache restart: it survives one)."""
        marker = self.l3_marker_if_needed(host, attempt, tiers)
        prompt = self.prompt(host, f"local tiers, attempt {attempt}")
        cold, before, _ = self.measured(host, prompt)
        if cold["cached_tokens"]:
            raise ProofError(f"{host}: a new prompt already had {cold['cached_tokens']} cached tokens")
        self.wait_stored(host, before)
        hits = []

        def hit(tier, counter, delta, reply, also_loaded=""):
            hits.append(
                Hit(
                    tier,
                    host,
                    reply["cached_tokens"],
                    reply["prompt_tokens"],
                    counter,
                    delta,
                    reply["seconds"],
                    cold["seconds"],
                    attempt=attempt,
                    wrong_answer=lmcache_probe.answer_difference(cold, reply) or "",
                    also_loaded=also_loaded,
                )
            )

        if "l0" in tiers:
            reply, base, after = self.measured(host, prompt)
            hit("l0", "lmcache_mp_lookup_hit_l1_tokens", after["l1_hit_tokens"] - base["l1_hit_tokens"], reply)
        order = self.t.lower_tiers
        for index, (tier, adapter) in enumerate(order):
            if tier not in tiers:
                continue
            self.empty_before(host, tier, marker)
            if tier == "l3":
                self.restart_lmcache(host)
                counter = f"l2_name={adapter} loads (after a restart)"
            else:
                self.clear_dram(host)
                counter = f"l2_name={adapter} loads"
            reply, base, after = self.measured(host, prompt)  # after a restart its counters start at zero
            # The tiers LMCache looks in later hold the prompt too: a DRAM miss must load from the first one alone.
            later = {a: loads(after, a) - loads(base, a) for _, a in order[index + 1 :]}
            also = ", ".join(f"{a} ({n} loads)" for a, n in later.items() if n)
            hit(tier, counter, loads(after, adapter) - loads(base, adapter), reply, also)
        if marker is not None:
            self.t.nodes[host].run("rm", "-f", marker)
        return hits

    def peer(self, source: str, target: str, attempt: int = 1) -> Hit:
        """A prompt computed on `source` is a hit on `target`, with L2 and the prompt's L3 files removed."""
        started = time.time()
        marker = self.l3_marker(source, attempt) if self.t.l3_name else None
        prompt = self.prompt(source, f"computed on {source} for {target}, attempt {attempt}")
        cold, before, _ = self.measured(source, prompt)
        self.wait_stored(source, before)
        if self.t.l2_name:
            self.flush_l2(source)
        if marker:
            self.remove_l3_since(source, marker)
        reply, base, after = self.measured(target, prompt)
        others = {a: loads(after, a) - loads(base, a) for a in (self.t.l2_name, self.t.l3_name) if a}
        if any(others.values()):
            raise ProofError(f"{target}: the P2P prompt was also loaded from {others}: L2/L3 were not emptied")
        hit = Hit(
            "l1",
            target,
            reply["cached_tokens"],
            reply["prompt_tokens"],
            "l2_name=p2p loads",
            loads(after, "p2p") - loads(base, "p2p"),
            reply["seconds"],
            cold["seconds"],
            source,
            attempt,
            wrong_answer=lmcache_probe.answer_difference(cold, reply) or "",
        )
        if not hit.proven:
            said = [f"{h} LMCache: {line}" for h in (target, source) for line in self.lmcache_warnings(h, started)]
            hit.why = "; ".join(
                [f"{target} sees {self.p2p_view(target)}"] + (said or ["no LMCache warning on either Spark"])
            )
        return hit

    def once_more(self, step):
        """step(1), and step(2) with new prompts if vLLM's engine died under a request (seen with bfloat16 on
        an AMX CPU: the lab serves float32 for that reason; this stays as the guard for any other engine death).
        The death is shown, never hidden, and the result says which attempt proved the tier."""
        try:
            return step(1)
        except EngineFailed as exc:
            self.out(f"  ! {exc}")
            self.out(f"  ! {exc.host}: systemd restarts vLLM; this step runs once more with new prompts")
            self.wait_ready(exc.host)
        return step(2)

    def run(self, tiers=TIERS, hosts=None) -> list:
        """Prove `tiers` on every Spark (or `hosts`): the local tiers one Spark at a time, then each Spark's
        peer tier with a prompt computed on the next one. Tiers the cluster does not have are skipped."""
        tiers = [t for t in tiers if self.t.spec.has(SPEC_TIER[t])]
        hosts = list(hosts or self.t.nodes)
        for host in hosts:
            self.wait_ready(host)
        hits = []
        # In the order they are proven: DRAM, then the lower tiers as LMCache looks them up.
        local = [t for t in ("l0", *(tier for tier, _ in self.t.lower_tiers)) if t in tiers]
        for host in hosts:
            if local:
                self.out(f"  {host}: {', then '.join(TIER_NAMES[t] for t in local)} ...")
                hits += self.once_more(lambda attempt, h=host: self.local(h, local, attempt))
        spark_names = list(self.t.nodes)
        if "l1" in tiers and len(spark_names) > 1:
            for target in hosts:
                source = spark_names[(spark_names.index(target) + 1) % len(spark_names)]
                self.wait_ready(target)
                self.out(f"  {target}: a prompt computed on {source}, with L2 and its L3 files removed ...")
                hits.append(self.once_more(lambda attempt, s=source, t=target: self.peer(s, t, attempt)))
        return hits


def loads(summary: dict, adapter: str) -> int:
    """Loads LMCache counted on one of its L2 adapters (fs, resp, p2p ...)."""
    return summary["l2"].get(adapter, {}).get("loads", 0)


def _stores(summary: dict, adapter: str) -> int:
    return summary["l2"].get(adapter, {}).get("stores", 0)


def table(hits: list) -> list:
    """The proof as a table a person reads: one line per Spark and tier."""
    lines = [f"  {'Spark':<9} {'tier':<28} {'cached':>7} {'of':>6}  {'counter':<38} {'moved':>5} {'s (cold)':>14}"]
    for h in hits:
        mark = ("" if h.attempt == 1 else f"   (attempt {h.attempt})") if h.proven else "   <- NOT PROVEN"
        timing = f"{h.seconds:.2f} ({h.cold_seconds:.2f})"
        lines.append(
            f"  {h.host:<9} {h.label:<28} {h.cached_tokens:>7} {h.prompt_tokens:>6}  {h.counter:<38} "
            f"{h.delta:>5} {timing:>14}{mark}"
        )
    lines += [f"  {h.host} {h.label}: {h.why}" for h in hits if not h.proven and h.why]
    lines += [f"  {h.host} {h.label}: a wrong answer from the cache: {h.wrong_answer}" for h in hits if h.wrong_answer]
    lines += [
        f"  {h.host} {h.label}: also loaded from {h.also_loaded}, looked up after it" for h in hits if h.also_loaded
    ]
    return lines
