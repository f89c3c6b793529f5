"""Health of what serves on a Spark: the LMCache server, vLLM, the lower tiers' adapters as LMCache counts
them, the hit rate (kvtier's L0) and stores that fall behind."""

from __future__ import annotations

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, UNVERIFIED, check
    from ansible.module_utils.kvtier_health_p2p import p2p_checks
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, UNVERIFIED, check
    from kvtier.probes.health_p2p import p2p_checks


# Share of the busiest adapter's bytes another may lag behind (stores in flight); more, not catching up, is failing.
STORE_GAP_FRACTION = 0.05


def serving_checks(host, probe, expect):
    """LMCache server, vLLM, P2P and the LMCache adapters of one Spark, from `probe_node`'s result.

    `expect`: model (served name), adapters (LMCache l2_name of each lower tier: {"l2": "resp", "l3": "fs",
    "l1_p2p": "p2p"}), p2p_peers (int or None).
    """
    out = []
    problems = " ".join(probe.get("problems") or [])
    if probe.get("lmcache_healthy") is False:
        out.append(
            check(
                host,
                "serving",
                ERR,
                "LMCACHE_DOWN",
                f"the LMCache server does not answer: {problems}",
                "systemctl status kvtier-lmcache; journalctl -u kvtier-lmcache (vLLM restarts with it)",
                name="lmcache",
            )
        )
    elif probe.get("lmcache_healthy"):
        unhealthy = (probe.get("lmcache_status") or {}).get("unhealthy") or []
        if unhealthy:
            out.append(
                check(
                    host,
                    "serving",
                    ERR,
                    "LMCACHE_UNHEALTHY",
                    "LMCache /status reports unhealthy parts: " + ", ".join(unhealthy),
                    "journalctl -u kvtier-lmcache; restart it with `systemctl restart kvtier-lmcache` (vLLM follows)",
                    name="lmcache",
                )
            )
        else:
            out.append(
                check(
                    host,
                    "serving",
                    OK,
                    "LMCACHE_OK",
                    "the LMCache server answers and reports no unhealthy part",
                    name="lmcache",
                )
            )
    if probe.get("vllm_healthy") is False:
        out.append(
            check(
                host,
                "serving",
                ERR,
                "VLLM_DOWN",
                f"vLLM does not answer /health: {problems}",
                "journalctl -u kvtier-vllm (it starts after the LMCache server and stops with it)",
                name="vllm",
            )
        )
    elif probe.get("vllm_healthy"):
        models = probe.get("models") or []
        if expect.get("model") and expect["model"] not in models:
            out.append(
                check(
                    host,
                    "serving",
                    ERR,
                    "VLLM_MODEL_MISSING",
                    f"vLLM serves {models}, not {expect['model']!r}",
                    "re-run spark.yml: the unit renders --served-model-name from kvtier_cluster.model",
                    name="vllm",
                )
            )
        else:
            out.append(
                check(host, "serving", OK, "VLLM_OK", f"vLLM serves {expect.get('model') or models}", name="vllm")
            )
    out += _adapter_checks(host, probe, expect)
    out += p2p_checks(host, probe, expect)
    out += _hit_checks(host, probe)
    return out


def _adapter_checks(host, probe, expect):
    summary = probe.get("lmcache")
    out = []
    for tier, name in sorted((expect.get("adapters") or {}).items()):
        if tier == "l1_p2p":
            continue  # P2P is checked by its registration and peers
        if summary is None:
            out.append(
                check(
                    host,
                    tier,
                    UNVERIFIED,
                    "LMCACHE_COUNTERS_UNAVAILABLE",
                    "LMCache's counters could not be read, so its store and load path to this tier is not verified",
                    "see LMCACHE_DOWN",
                )
            )
            continue
        seen = (summary.get("l2") or {}).get(name)
        if seen is None and summary.get("l2_store_requests_completed", 0) == 0:
            out.append(
                check(
                    host,
                    tier,
                    UNVERIFIED,
                    "LMCACHE_NO_STORES_YET",
                    f"LMCache has stored nothing yet, so "
                    f"its {name} adapter has no counters: send a request (or run with --canary)",
                )
            )
        elif seen is None:
            out.append(
                check(
                    host,
                    tier,
                    ERR,
                    "LMCACHE_ADAPTER_MISSING",
                    f"LMCache stores to "
                    f"{', '.join(sorted(summary.get('l2') or {})) or 'nothing'} but has no {name} adapter",
                    "the running server was started without it: re-run spark.yml (it renders --l2-adapter "
                    "for every tier in kvtier_cluster.tiers)",
                )
            )
        else:
            out.append(
                check(
                    host,
                    tier,
                    OK,
                    "LMCACHE_ADAPTER_OK",
                    f"LMCache's {name} adapter: {seen['stores']} "
                    f"stores, {seen['loads']} loads, {seen['usage_bytes']} bytes",
                )
            )
    return out


def _hit_checks(host, probe):
    s = probe.get("lmcache")
    if not probe:
        return []  # nothing was probed on this node
    if not s:
        return [
            check(
                host,
                "l0",
                UNVERIFIED,
                "LMCACHE_COUNTERS_UNAVAILABLE",
                "LMCache's counters could not be read, so no hit rate",
                "see LMCACHE_DOWN",
            )
        ]
    requested = s.get("requested_tokens") or 0
    if not requested:
        return [check(host, "l0", UNVERIFIED, "HITS_NO_LOOKUPS", "no lookups yet: hit rates need traffic")]
    rate = (s.get("hit_tokens") or 0) / requested
    l0 = (s.get("l1_hit_tokens") or 0) / requested
    lower = ", ".join(f"{n} {v['loads']} loads" for n, v in sorted((s.get("l2") or {}).items()))
    return [
        check(
            host,
            "l0",
            OK,
            "HIT_RATE",
            f"{rate:.0%} of {requested} looked-up tokens hit ({l0:.0%} from "
            f"LMCache's DRAM, kvtier's L0); lower tiers: {lower or 'none'}; LMCache DRAM holds "
            f"{s.get('l1_memory_usage_bytes', 0)} bytes",
        )
    ]


def _held(summary):
    """{adapter: (bytes it holds, stores it completed)}; p2p holds nothing of its own (it reads the peers' DRAM)."""
    adapters = ((summary or {}).get("l2") or {}).items()
    return {name: (v.get("usage_bytes", 0), v.get("stores", 0)) for name, v in adapters if name != "p2p"}


def _missing_bytes(held, name):
    """Bytes the adapter `name` lacks for the stores it completed, at the busiest adapter's bytes per store."""
    busiest_bytes, busiest_stores = max(held.values())
    if not busiest_stores:
        return 0, 0
    have, stores = held.get(name, (0, 0))
    expected = stores * busiest_bytes / busiest_stores
    return expected - have, expected


def store_gap_checks(host, summary, expect, later=None):
    """A lower tier whose stores fail while requests succeed (a black hole).

    `summary`, `later`: `lmcache_summary` read twice, a second apart. LMCache counts a failed store as completed
    (measured with lmcache 0.5.6: after the L2 server restarted, resp kept "completing" stores while the bytes it
    holds stood still), so a failing adapter holds fewer bytes than its completed stores need: every store of a
    chunk is the same size on every adapter (the busiest adapter gives bytes per store). An adapter that completes
    fewer stores is not failing: it skips chunks it already has (L2 may have been emptied and refilled meanwhile).
    One more than STORE_GAP_FRACTION short that does not catch up is failing.

    Only L2 is judged this way. The L3 pool is one directory shared by every Spark, and LMCache's fs adapter
    completes a store request without writing the chunks another Spark already wrote: on a healthy lab it held
    84-93 % of resp's bytes over the same 17-21 store requests. An L3 that cannot be written is named by its own
    checks (L3_DIR_MISSING, L3_READ_ONLY, L3_NOT_MOUNTED).
    """
    now, after = _held(summary), _held(later if later is not None else summary)
    wanted = {tier: name for tier, name in (expect.get("adapters") or {}).items() if tier == "l2"}
    if not now or not wanted or len(now) < 2:
        return []
    out = []
    for tier, name in sorted(wanted.items()):
        (gap, expected), (gap_later, _) = _missing_bytes(now, name), _missing_bytes(after, name)
        if gap > STORE_GAP_FRACTION * expected and gap_later >= gap:
            have, stores = after.get(name, (0, 0))
            busiest_bytes, busiest_stores = max(after.values())
            out.append(
                check(
                    host,
                    tier,
                    ERR,
                    f"{tier.upper()}_STORES_FAILING",
                    f"LMCache's {name} adapter holds {have} bytes after {stores} stores, where the busiest adapter "
                    f"holds {busiest_bytes} after {busiest_stores}, and it is not catching up: its stores fail, "
                    "while requests still succeed",
                    "fix the tier (see its own checks), then restart this node's LMCache server "
                    "(playbooks/repair_lmcache.yml): its adapter does not reconnect by itself",
                )
            )
    return out
