"""Health of the L1 peer-to-peer tier: the P2P coordinator (read on its node), each Spark's registration and peers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, UNVERIFIED, WARN, check
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, UNVERIFIED, WARN, check


def coordinator_state(url, timeout=5.0):
    """The P2P coordinator's registered instances (GET /instances), as a node on the data network sees them."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/instances", timeout=timeout) as response:
            body = json.loads(response.read().decode() or "null")
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return {"url": url, "error": str(exc)}
    if isinstance(body, dict):
        body = body.get("instances", body)
    if isinstance(body, dict):  # keyed by instance id
        body = [
            dict(v, instance_id=v.get("instance_id", k)) if isinstance(v, dict) else {"instance_id": k}
            for k, v in body.items()
        ]
    if not isinstance(body, list):
        return {"url": url, "error": f"unexpected answer: {str(body)[:120]}"}
    return {"url": url, "instances": [i for i in body if isinstance(i, dict)]}


def p2p_checks(host, probe, expect):
    peers = expect.get("p2p_peers")
    if peers is None:
        return []
    status = probe.get("lmcache_status")
    if status is None:
        return [
            check(host, "l1_p2p", UNVERIFIED, "P2P_UNKNOWN", "LMCache's /status could not be read", "see LMCACHE_DOWN")
        ]
    if not status.get("p2p_enabled") or status.get("p2p_state") != "registered":
        return [
            check(
                host,
                "l1_p2p",
                ERR,
                "P2P_NOT_REGISTERED",
                f"LMCache P2P is {status.get('p2p_state')!r}, not "
                f"registered with the coordinator: every peer lookup misses",
                "check kvtier-lmcache-coordinator on the coordinator host and the data network; LMCache "
                "registers again on its own once the coordinator answers",
            )
        ]
    seen = status.get("p2p_peers") or []
    if len(seen) < peers:
        return [
            check(
                host,
                "l1_p2p",
                ERR,
                "P2P_PEER_MISSING",
                f"LMCache P2P sees {len(seen)} peer(s) ({', '.join(seen) or 'none'}), expected {peers}",
                "a peer's LMCache server is down or not registered: check it (its P2P_NOT_REGISTERED); a "
                "restarted peer reappears after the next coordinator poll",
            )
        ]
    return [check(host, "l1_p2p", OK, "P2P_OK", f"registered, peers {', '.join(seen) or 'none (no other Spark)'}")]


def coordinator_checks(host, state, expected):
    """The coordinator on `host` must list exactly the serving nodes (`expected`: {instance id: data address}):
    one missing is a Spark no peer can find; an unknown or stale one is looked up by every peer in vain."""
    if not state or state.get("error"):
        return [
            check(
                host,
                "l1_p2p",
                ERR,
                "P2P_COORDINATOR_DOWN",
                f"the P2P coordinator at {(state or {}).get('url')} does not answer ({(state or {}).get('error')}): "
                "restarted Sparks cannot find their peers",
                f"systemctl status kvtier-lmcache-coordinator on {host}; re-run spark.yml",
            )
        ]
    seen = {str(i.get("instance_id")): i for i in state.get("instances") or []}
    out = []
    missing = sorted(set(expected) - set(seen))
    if missing:
        out.append(
            check(
                host,
                "l1_p2p",
                ERR,
                "P2P_COORDINATOR_MISSING",
                f"{', '.join(missing)} not registered at the coordinator: no peer looks up its cache",
                "restart the LMCache server on each (its coordinator heartbeat registers it); check --coordinator-url",
            )
        )
    strays = [
        f"{name} ({i.get('ip')})"
        for name, i in sorted(seen.items())
        if name not in expected or (i.get("ip") and i.get("ip") != expected[name])
    ]
    if strays:
        out.append(
            check(
                host,
                "l1_p2p",
                WARN,
                "P2P_COORDINATOR_STALE",
                f"the coordinator lists {', '.join(strays)}, not a serving node at its data address",
                "stop whatever registers it, or restart the coordinator (the Sparks register again within a heartbeat)",
            )
        )
    return out or [
        check(
            host, "l1_p2p", OK, "P2P_COORDINATOR_OK", f"instances: {', '.join(sorted(seen))}, each at its data address"
        )
    ]
