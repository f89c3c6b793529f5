"""Health of the L2 tier (Valkey/Redis) as LMCache sees it: the login LMCache uses (read from its process or its
environment file on the node), the server's memory and latency, and a restart under LMCache."""

from __future__ import annotations

import re

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, WARN, check
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, WARN, check


L2_MEMORY_WARN = 0.95

# A PING over a RoCE data network takes well under a millisecond; the QEMU/TCG lab measures 1-5 ms. Above this the
# store path is congested or the server overloaded.
L2_LATENCY_WARN_MS = 20.0

# Clocks of a Spark and the storage node can differ by this much before an L2 restart is told from its start.
L2_RESTART_MARGIN_S = 30

# Where LMCache's resp adapter reads its L2 login (kvtier renders both into the server's root-only environment file).
# The valkey adapter's login sits in its JSON argument, swapped for some LMCache releases: not read here.
L2_LOGIN_ENV = ("LMCACHE_RESP_USERNAME", "LMCACHE_RESP_PASSWORD")


def process_l2_login(pid):
    """(user, password) the LMCache server `pid` logs in to L2 with, from its environment; None when it holds none
    or cannot be read. Only for a probe's login: no check ever carries the password."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            pairs = [a.decode("utf-8", "replace").split("=", 1) for a in f.read().split(b"\0") if b"=" in a]
    except (OSError, ValueError, TypeError):
        return None
    return _login(dict(pairs))


def env_file_l2_login(path):
    """(user, password) in a systemd EnvironmentFile as kvtier writes it (NAME="value", backslash escapes): the login
    LMCache starts with; None when the file holds none or cannot be read (it is root's only)."""
    env = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, sep, value = line.strip().partition("=")
                if not sep or name.startswith("#"):
                    continue
                if len(value) >= 2 and value[0] == value[-1] == '"':
                    value = re.sub(r"\\(.)", r"\1", value[1:-1])
                env[name] = value
    except OSError:
        return None
    return _login(env)


def _login(env):
    if not all(env.get(name) for name in L2_LOGIN_ENV):
        return None
    return tuple(env[name] for name in L2_LOGIN_ENV)


def lmcache_l2_view(pid, known, view, env_file=None):
    """L2 as the LMCache server logs in with its own credentials: `view(user, password)` (`client_view` bound to the
    server's address) plus login_from: "process" (the running server `pid`), or "file" (`env_file`, what it starts
    with, when it does not run). None when no login can be read or it is `known` (user, password), already probed:
    a login changed on the node alone is invisible to a probe that takes the inventory's password."""
    login, source = (process_l2_login(pid) if pid else None), "process"
    if login is None and env_file:
        login, source = env_file_l2_login(env_file), "file"
    if login is None or login == tuple(known or ()):
        return None
    return {**view(*login), "login_from": source}


def l2_checks(host, facts):
    """The L2 server as LMCache's user sees it from `host`: reachable, authenticated, memory, evictions, latency.

    `facts`: {error?, auth_error?, info {used_memory, maxmemory, evicted_keys, ...}, ping_ms}.
    """
    if facts.get("error"):
        return [
            check(
                host,
                "l2",
                ERR,
                "L2_DOWN",
                f"the L2 server does not answer: {facts['error']}",
                "start it on the storage node (systemctl start valkey-server or redis-server) and check the "
                "data network",
            )
        ]
    if facts.get("auth_error"):
        return [
            check(
                host,
                "l2",
                ERR,
                "L2_AUTH",
                f"LMCache's L2 user cannot log in: {facts['auth_error']}",
                "the node's copy of the password (kvtier_cluster.l2.password_var) must equal "
                "kv_store_lmcache_password; re-run site.yml",
            )
        ]
    info = facts.get("info") or {}
    out = []
    used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    if limit and used / limit >= L2_MEMORY_WARN:
        out.append(
            check(
                host,
                "l2",
                WARN,
                "L2_MEMORY_FULL",
                f"{used} of {limit} bytes used: new entries evict old ones",
                "raise kv_store_maxmemory if the storage node has the RAM",
            )
        )
    elif not limit:
        out.append(
            check(
                host,
                "l2",
                WARN,
                "L2_NO_MAXMEMORY",
                "maxmemory is 0: the server grows until the host swaps",
                "set kv_store_maxmemory and re-run storage.yml",
            )
        )
    ping = facts.get("ping_ms")
    if ping is not None and ping > L2_LATENCY_WARN_MS:
        out.append(
            check(
                host,
                "l2",
                WARN,
                "L2_LATENCY",
                f"PING took {ping:.1f} ms (over {L2_LATENCY_WARN_MS:g} ms)",
                "check the data network and the storage node's load",
            )
        )
    evicted = int(info.get("evicted_keys", 0))
    if not out:
        out.append(
            check(
                host,
                "l2",
                OK,
                "L2_OK",
                f"authenticated; {used} of {limit} bytes used, {evicted} keys evicted, PING {ping:.1f} ms"
                if ping is not None
                else "authenticated",
            )
        )
    return out


def l2_login_checks(host, own):
    """LMCache's own L2 login, where it differs from the inventory's (`lmcache_l2_view`): refused is L2_AUTH. A
    running server would hang every request that reaches L2 (LMCache 0.5.6), so kvtier's unit does not start with
    it. Down and memory are judged by `l2_checks`."""
    if not own or not own.get("auth_error"):
        return []
    if own.get("login_from") == "process":
        what = "the running LMCache server logs in to L2 with other credentials than the inventory's"
    else:
        what = (
            "the LMCache server's secrets file holds other L2 credentials than the inventory's (its unit refuses "
            "to start with them)"
        )
    return [
        check(
            host,
            "l2",
            ERR,
            "L2_AUTH",
            f"{what}, and the L2 server refuses them ({own['auth_error']})",
            f"the file was changed on the node: re-run spark.yml --limit {host} (it writes the file again and "
            "restarts LMCache behind the router)",
        )
    ]


def l2_restart_checks(host, l2, lmcache, adapter):
    """The L2 server started after this node's LMCache server: LMCache 0.5.6's resp adapter keeps its old
    connection, never reconnects, and every store to L2 fails until the LMCache server restarts."""
    info = (l2 or {}).get("info") or {}
    started = (lmcache or {}).get("started_at")
    if adapter != "resp" or not info.get("uptime_in_seconds") or not l2.get("observed_at") or not started:
        return []
    l2_started = l2["observed_at"] - int(info["uptime_in_seconds"])
    if l2_started <= started + L2_RESTART_MARGIN_S:
        return []
    return [
        check(
            host,
            "l2",
            ERR,
            "L2_RESTARTED_UNDER_LMCACHE",
            f"the L2 server started {l2_started - started:.0f} s after this node's LMCache server: LMCache's resp "
            "adapter does not reconnect, so no store reaches L2 (requests still succeed)",
            "restart this node's LMCache server: ansible-playbook playbooks/repair_lmcache.yml (one Spark at a time)",
        )
    ]
