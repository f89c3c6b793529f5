"""Canaries: every tier proven on a serving cluster without disturbing it (`kvtier health --canary`).

The tier proof (tiers.py) empties whole tiers to show the one below; a serving cluster cannot allow that. A canary
prompt instead carries its own cache salt (vLLM's ``cache_salt`` request field, which LMCache writes into every
object key), so its cache entries belong to it alone: no client's request can hit them, and they can be named and
removed one by one through LMCache's own API (``DELETE /cache/objects``). Each tier is shown by removing the
canary's entries, and only those, from the tiers LMCache looks in first:

  L0 local DRAM  the canary again: LMCache's DRAM (its "L1") hit tokens rise;
  L2 remote      its entries removed from this Spark's DRAM: the repeat loads through the L2 adapter;
  L3 NVMe pool   removed from DRAM and from L2 as well: the repeat loads through the ``fs`` adapter;
  L1 peer        computed on another Spark, removed from L2 and L3 (shared): loaded through ``p2p`` from its DRAM.

Every canary's entries are removed from every tier at the end, whatever happened. A canary is short (a few
chunks) and its prompts say what they are ("kvtier canary ..."), so they are easy to tell apart in logs. Each
result is a health check (host, tier, status, code, reason, fix): OK when the tier's LMCache counter moved and
vLLM reported the cached tokens, ERR when the entry was where it should be and the tier did not serve it,
UNVERIFIED when the canary could not be carried out (never a false OK).

Counters are per server, not per request: on a busy cluster another request can move the same counter in the same
second, so an OK says the tier served the canary or something else at that moment; a miss is never hidden.
"""

from __future__ import annotations

import secrets

from kvtier.nodes.scripts import script
from kvtier.nodes.transport import NodeError
from kvtier.probes import health as h
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import resp as resp_probe
from kvtier.proof.tiers import ProofError

_PROBES = script(lmcache_probe, resp_probe)
CHUNKS = 3  # full chunks per canary prompt: enough to show a load, small enough to cost nothing
CODES = {"l0": "CANARY_L0", "l1": "CANARY_P2P", "l2": "CANARY_L2", "l3": "CANARY_L3"}
HEALTH_TIER = {"l0": "l0", "l1": "l1_p2p", "l2": "l2", "l3": "l3"}
FIX = {
    "l0": "read `journalctl -u <lmcache unit>` for allocation failures (LMCache DRAM too small for a chunk?)",
    "l2": "check the L2 checks above (auth, reachability); if LMCache's own adapter is broken while the server is "
    "fine, run playbooks/repair_lmcache.yml",
    "l3": "check the L3 checks above (mount, read-only, free space) and LMCache's journal for fs errors",
    "l1": "check P2P registration and peers above; restart the peer's LMCache behind the router if it stays stale",
}


class CanaryError(ProofError):
    """A canary could not be carried out (a request failed, its entries were never written)."""


class Canary:
    """Canaries against one cluster: `run()` returns health checks. Nothing outside the canaries' own entries is
    touched: no flush, no clear, no restart."""

    def __init__(self, target, out=print, store_timeout: float = 60):
        self.t, self.out, self.store_timeout = target, out, store_timeout
        self.nonce = secrets.token_hex(4)  # this run's canaries are new to every tier
        # salt -> {host: the Spark that stored it, keys, removed: the shared adapters it is already out of}
        self.planted: dict = {}
        self._count = 0

    # --- the canary's own entries -------------------------------------------------------------------------
    def salt(self, purpose: str) -> str:
        self._count += 1
        return f"kvtier-canary-{self.nonce}-{self._count}-{purpose}"[:128]  # LMCache's limit for a salt

    def endpoints(self, host: str) -> dict:
        lmcache_http = self.t.lmcache_url(host)
        return {
            "vllm": self.t.vllm_url(host),
            "lmcache_http": lmcache_http,
            "lmcache_metrics": lmcache_http + "/metrics",
        }

    def l2_scan(self, host: str, pattern: str) -> list:
        """L2 keys matching `pattern`, read from `host` as L2's admin user (the LMCache user may not SCAN)."""
        l2 = self.t.spec.l2
        call = (
            f"matching_keys({l2.host!r}, {l2.port!r}, {self.t.l2_admin_user!r}, {self.t.l2_admin_password!r}, "
            f"{pattern!r})"
        )
        return self.t.nodes[host].python(_PROBES, call, timeout=60)

    def l2_keys(self, host: str, salt: str) -> list:
        """The canary's object keys in L2, for a cluster without L3 to list them from."""
        if self.t.spec.l2 is None or not self.t.l2_admin_password:
            raise CanaryError("the canary's entries cannot be listed: no L3, and no L2 admin password in the inventory")
        keys = (lmcache_probe.salted_object_key(k, salt) for k in self.l2_scan(host, "*@" + salt))
        return [k for k in keys if k]

    def forget(self, host: str, keys: list, tier: str, adapter: str | None = None) -> None:
        call = f"forget({self.t.lmcache_url(host)!r}, {keys!r}, {tier!r}, {adapter!r})"
        self.t.nodes[host].python(_PROBES, call, timeout=60)

    def unshare(self, salt: str, adapters) -> None:
        """Remove a canary from shared tiers through the Spark that stored it, once per adapter. LMCache counts the
        bytes each of its adapters holds per server (health's L2_STORES_FAILING compares them): removed through
        another server, or twice, the counts of the two adapters would no longer agree."""
        entry = self.planted[salt]
        for adapter in adapters:
            if adapter not in entry["removed"]:
                self.forget(entry["host"], entry["keys"], "l2", adapter)
                entry["removed"].add(adapter)

    def remove_all(self) -> None:
        """Every canary's entries out of every Spark's DRAM and out of the shared tiers (best effort, never raises:
        an entry left behind costs a little space and is evicted like any other)."""
        shared = [a for a in (self.t.l2_name, self.t.l3_name) if a]
        for salt, entry in self.planted.items():
            try:
                self.unshare(salt, [a for a in shared if a not in entry["late"]])
                for host in self.t.nodes:
                    self.forget(host, entry["keys"], "l1")
            except (NodeError, ValueError) as exc:
                self.out(f"  ! the canary {salt} could not be removed everywhere: {exc}")
        self.planted.clear()

    def leftovers(self) -> list:
        """Entries of any canary (this run's or an earlier one's) still in the shared tiers: L3 files, and L2 keys
        where the inventory holds the L2 admin password."""
        via, spec, found = next(iter(self.t.nodes)), self.t.spec, []
        if spec.l3 is not None:
            call = f"[n for n in os.listdir({spec.l3.path!r}) if '@kvtier-canary-' in n]"
            found += self.t.nodes[via].python(_PROBES, call, timeout=60)
        if spec.l2 is not None and self.t.l2_admin_password:
            found += self.l2_scan(via, "*@kvtier-canary-*")
        return found

    # --- the canaries -------------------------------------------------------------------------------------
    def stored(self, host: str, purpose: str) -> tuple:
        """A new canary computed on `host`: (prompt, salt, keys, cold reply, adapters that did not store it)."""
        salt, spec = self.salt(purpose), self.t.spec
        adapters = [a for a in (self.t.l2_name, self.t.l3_name) if a]
        l3_path = spec.l3.path if spec.l3 is not None else None
        call = (
            f"(lambda p: dict(plant({self.endpoints(host)!r}, {self.t.model!r}, p, {salt!r}, "
            f"{spec.lmcache.chunk_size!r}, {adapters!r}, {l3_path!r}, {self.store_timeout!r}), prompt=p))"
            f"(canary_prompt({salt!r}, {spec.lmcache.chunk_size!r}, {CHUNKS!r}))"
        )
        planted = self.t.nodes[host].python(_PROBES, call, timeout=self.store_timeout + 660)
        cold, late, keys = planted["cold"], planted["late"], planted["keys"]
        if l3_path is None and self.t.l2_name and self.t.l2_name not in late:
            keys = self.l2_keys(host, salt)
        # Whatever happens next, these are removed at the end (an adapter that stored nothing has nothing to remove).
        self.planted[salt] = {"host": host, "keys": keys, "late": late, "removed": set()}
        if cold["cached_tokens"]:
            raise CanaryError(f"{host}: a new canary already had {cold['cached_tokens']} cached tokens")
        lowest = self.t.l3_name or self.t.l2_name
        if lowest and lowest not in late and len(keys) < planted["wanted"]:
            raise CanaryError(
                f"{host}: {len(keys)} of the canary's {planted['wanted']} chunks were stored in {lowest} within "
                f"{self.store_timeout:.0f} s"
            )
        if not (lowest and lowest not in late):
            keys = self.planted[salt]["keys"] = []
        return planted["prompt"], salt, keys, cold, late

    def local(self, host: str) -> list:
        """L0 and the lower tiers of one Spark, with one canary: each lower tier in LMCache's load order, after
        removing the canary from DRAM and from the tiers LMCache would look in first."""
        prompt, salt, keys, cold, late = self.stored(host, "local")
        served = self.serve(host, prompt, salt)
        results = [self._hit("l0", host, served["reply"], cold, served["l1_hit_tokens"], "DRAM")]
        order = self.t.lower_tiers
        for index, (tier, adapter) in enumerate(order):
            if adapter in late:
                results.append(self._not_stored(tier, host, adapter))
                continue
            if not keys:
                results += self._unverified(
                    host, [tier], "its entries could not be listed (the lowest tier did not store it)"
                )
                continue
            self.forget(host, keys, "l1")
            first = [a for _, a in order[:index] if a not in late]
            try:
                self.unshare(salt, first)
            except NodeError as exc:  # a tier looked up first might still serve it: this result would be a false miss
                results += self._unverified(
                    host, [tier], f"its entries in {', '.join(first)} could not be removed: {exc}"
                )
                continue
            served = self.serve(host, prompt, salt)
            hit = self._hit(tier, host, served["reply"], cold, served["loads"].get(adapter, 0), adapter)
            # Every tier looked up after this one holds the canary too: a DRAM miss must load from the first alone.
            later = {a: served["loads"].get(a, 0) for _, a in order[index + 1 :] if served["loads"].get(a, 0)}
            if hit["status"] == h.OK and later:
                hit = h.check(
                    host,
                    HEALTH_TIER[tier],
                    h.ERR,
                    CODES[tier] + "_NOT_FIRST",
                    f"a canary that the {adapter} adapter holds was also loaded from "
                    f"{', '.join(f'{a} ({n} loads)' for a, n in later.items())}, looked up after it",
                    "LMCache loads from the first adapter that holds a chunk unless its prefetch policy says "
                    "otherwise: re-run spark.yml (it renders the order and the policy)",
                    name=CODES[tier].lower(),
                )
            results.append(hit)
        return results

    def peer(self, source_host: str, target: str) -> dict:
        """A canary computed on `source_host`, removed from L2 and L3: `target` loads it through P2P."""
        prompt, salt, keys, cold, late = self.stored(source_host, f"from-{source_host}")
        persistent = [a for a in (self.t.l2_name, self.t.l3_name) if a]
        if persistent and not keys:
            raise CanaryError(f"its entries on {source_host} could not be listed (not stored in {', '.join(late)})")
        self.unshare(salt, [a for a in persistent if a not in late])  # one that did not store it has nothing
        return self._load("l1", target, prompt, salt, cold, "p2p", source_host)

    def serve(self, host: str, prompt: str, salt: str) -> dict:
        call = f"serve({self.endpoints(host)!r}, {self.t.model!r}, {prompt!r}, {salt!r})"
        served = self.t.nodes[host].python(_PROBES, call, timeout=660)
        if served["reply"]["status"] != 200:
            raise CanaryError(
                f"{host}: vLLM answered {served['reply']['status'] or 'nothing'}: {served['reply']['error'][:200]}"
            )
        return served

    def _load(self, tier, host, prompt, salt, cold, adapter, source_host="") -> dict:
        served = self.serve(host, prompt, salt)
        return self._hit(tier, host, served["reply"], cold, served["loads"].get(adapter, 0), adapter, source_host)

    def _hit(self, tier, host, reply, cold, delta, counted, source_host="") -> dict:
        what = "LMCache's DRAM" if tier == "l0" else f"the {counted} adapter"
        where = f" from {source_host}" if source_host else ""
        wrong = lmcache_probe.answer_difference(cold, reply)
        if reply["cached_tokens"] > 0 and delta > 0 and wrong:
            return h.check(
                host,
                HEALTH_TIER[tier],
                h.ERR,
                CODES[tier] + "_WRONG_ANSWER",
                f"a canary{where} served from {what} was answered differently from its cold computation: {wrong}",
                "the cached KV is not what this node computes: compare the nodes' model, dtype and kv-cache dtype "
                "(health's config checks), and remove the tier's entries (they are wrong for every reader)",
                name=CODES[tier].lower(),
            )
        if reply["cached_tokens"] > 0 and delta > 0:
            return h.check(
                host,
                HEALTH_TIER[tier],
                h.OK,
                CODES[tier] + "_OK",
                f"a canary{where} was served from {what}: {reply['cached_tokens']} of {reply['prompt_tokens']} "
                f"tokens cached, {reply['seconds']:.2f} s against {cold['seconds']:.2f} s cold",
                name=CODES[tier].lower(),
            )
        return h.check(
            host,
            HEALTH_TIER[tier],
            h.ERR,
            CODES[tier] + "_MISS",
            f"a canary{where} that {what} should have served was not: {reply['cached_tokens']} tokens cached, "
            f"{counted} counter moved by {delta}",
            FIX[tier],
            name=CODES[tier].lower(),
        )

    def _not_stored(self, tier: str, host: str, adapter: str) -> dict:
        return h.check(
            host,
            HEALTH_TIER[tier],
            h.ERR,
            CODES[tier] + "_NOT_STORED",
            f"a canary was never stored through the {adapter} adapter: no store completed within "
            f"{self.store_timeout:.0f} s",
            FIX[tier],
            name=CODES[tier].lower(),
        )

    def _unverified(self, host: str, tiers, why: str) -> list:
        return [
            h.check(
                host,
                HEALTH_TIER[t],
                h.UNVERIFIED,
                "CANARY_NOT_RUN",
                f"the canary could not run: {why}",
                "read the reason; the other checks above say whether the node serves",
                name=CODES[t].lower(),
            )
            for t in tiers
        ]

    def run(self, hosts=None) -> list:
        """Canaries for every tier the cluster has, on every Spark (or on `hosts`, the ones that serve); health
        checks. A P2P canary is computed on the next of those Sparks."""
        hosts = list(self.t.nodes) if hosts is None else list(hosts)
        local = ["l0"] + [tier for tier, _ in self.t.lower_tiers]
        results = []
        try:
            for host in hosts:
                try:
                    results += self.local(host)
                except (ProofError, NodeError, ValueError) as exc:
                    results += self._unverified(host, local, str(exc))
            if self.t.spec.has("l1_p2p") and len(self.t.nodes) > 1:
                for target in hosts:
                    if len(hosts) < 2:
                        results += self._unverified(target, ["l1"], "no other serving Spark to compute it on")
                        continue
                    source_host = hosts[(hosts.index(target) + 1) % len(hosts)]
                    try:
                        results.append(self.peer(source_host, target))
                    except (ProofError, NodeError, ValueError) as exc:
                        results += self._unverified(target, ["l1"], str(exc))
        finally:
            self.remove_all()
        return results
