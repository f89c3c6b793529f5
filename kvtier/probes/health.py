"""Health checks: facts gathered on a node turned into named checks, each with a stable code and its fix.

Standard library only: the gatherers (`running_service`, `directory_state`) run on the nodes (fed as source by
the kvtier CLI, or as module_utils/kvtier_health.py in the kvtier_health module), and the evaluators are pure
functions over the facts that the existing probes return (`kvtier_lmcache.probe_node`, `kvtier_nfs`,
`kvtier_nvme`, RESP INFO). Every check is a dict:

    {"host", "tier", "status", "code", "reason", "fix"}

tier:   l0, l1_p2p, l2, l3, fabric, storage, serving, config (kvtier's tier names; LMCache's own words only
        where its counters are meant).
status: OK, WARN, ERR, or UNVERIFIED when the check could not run (the reason says why: never a false OK).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

OK, WARN, ERR, UNVERIFIED = "OK", "WARN", "ERR", "UNVERIFIED"
STATUSES = (OK, WARN, ERR, UNVERIFIED)
# The flags of the running services that make cache keys equal on every node (what LMCache hashes, and the
# KV layout vLLM hands it); a difference between nodes means zero hits with no error.
KEY_FLAGS = {
    "lmcache": {"--chunk-size": "CHUNK", "--hash-algorithm": "HASH"},
    "vllm": {"--model": "MODEL", "--dtype": "DTYPE", "--block-size": "BLOCK", "--kv-cache-dtype": "DTYPE"},
}
KEY_ENV = {"PYTHONHASHSEED": "HASH"}
L2_MEMORY_WARN = 0.95
# A PING over a RoCE data network takes well under a millisecond; the QEMU/TCG lab measures 1-5 ms. Above this the
# store path is congested or the server overloaded.
L2_LATENCY_WARN_MS = 20.0
FREE_WARN, FREE_ERR = 0.10, 0.02
RSIZE_WANTED = 1048576
# Share of the busiest adapter's bytes another may lag behind (stores in flight); more, not catching up, is failing.
STORE_GAP_FRACTION = 0.05
# Clocks of a Spark and the storage node can differ by this much before an L2 restart is told from its start.
L2_RESTART_MARGIN_S = 30
# Where LMCache's resp adapter reads its L2 login (kvtier renders both into the server's root-only environment file).
# The valkey adapter's login sits in its JSON argument, swapped for some LMCache releases: not read here.
L2_LOGIN_ENV = ("LMCACHE_RESP_USERNAME", "LMCACHE_RESP_PASSWORD")


def check(host, tier, status, code, reason, fix="", name=""):
    """One check's result. `name` is the check's identity on its host, the same whatever its status or code (one
    metric series, one alert timer): by default the reporting function's (`l2_checks` and `_l2_checks` give `l2`)."""
    name = name or sys._getframe(1).f_code.co_name.strip("_").removesuffix("_checks")
    return {"host": host, "tier": tier, "check": name, "status": status, "code": code, "reason": reason, "fix": fix}


# --- gatherers (run on the node) -----------------------------------------------------------------------------


def running_service(unit):
    """The running unit's main process: {active, pid, argv, env (the key settings only)}; active False if down."""
    try:
        out = subprocess.run(
            ["systemctl", "show", unit, "-p", "ActiveState", "-p", "MainPID"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"active": False, "error": str(exc)}
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    pid = container_process(int(props.get("MainPID") or 0))
    result = {"active": props.get("ActiveState") == "active", "state": props.get("ActiveState"), "pid": pid}
    if pid <= 0:
        return result
    result["started_at"] = process_started_at(pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            result["argv"] = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [a.decode("utf-8", "replace").split("=", 1) for a in f.read().split(b"\0") if b"=" in a]
        # Only what decides cache keys and the fingerprint: the environment also holds the L2 password.
        result["env"] = {k: v for k, v in pairs if k in KEY_ENV or k == "KVTIER_FINGERPRINT"}
    except OSError as exc:
        result["error"] = str(exc)
    return result


CONTAINER_ENGINES = ("podman", "docker")


def container_process(pid):
    """The process a unit really runs: on the container route its main process is the engine's client (`podman run
    ... --name NAME IMAGE argv`), and the service is the container's first process, which `--pid host` makes a
    process of this host (the engine's inspect names it). Any other process is itself; 0 when it cannot be told."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return pid
    if len(argv) < 3 or os.path.basename(argv[0]) not in CONTAINER_ENGINES or argv[1] != "run" or "--name" not in argv:
        return pid
    name = argv[argv.index("--name") + 1]
    try:
        out = subprocess.run(
            [argv[0], "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True, timeout=10
        ).stdout
        return int(out.strip() or 0)
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


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


def process_started_at(pid):
    """When a process started, in seconds since the epoch (this host's clock); None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the comm field
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_credentials(pid):
    """(uid, gid, supplementary groups) a running process acts with, from /proc; None if it cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/status", encoding="ascii", errors="replace") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        uid, gid = int(fields["Uid"].split()[1]), int(fields["Gid"].split()[1])  # the effective ids
        return uid, gid, [int(g) for g in fields.get("Groups", "").split()]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def writable_by(path, pid):
    """Whether process `pid` may create files in `path`, or None when that cannot be told. The probe runs as root,
    which may write anywhere: so a child takes the process's uid, gid and groups and asks the kernel, which
    decides as it would for the process itself (modes, ACLs, an NFS server's squashing)."""
    creds = process_credentials(pid) if pid else None
    if creds is None:
        return None
    uid, gid, groups = creds
    if os.geteuid() != 0:
        return os.access(path, os.W_OK | os.X_OK) if uid == os.geteuid() else None
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's outcome is its exit status)
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            os._exit(0 if os.access(path, os.W_OK | os.X_OK) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    return {0: True, 1: False}.get(os.waitstatus_to_exitcode(status))


def directory_state(path, writer_pid=None):
    """{exists, writable, writable_as, free_ratio, free_bytes} of a directory (the L3 path, the array's mount);
    writable as the process `writer_pid` (LMCache's server) where given and readable, else as this probe."""
    state = {"path": path, "exists": os.path.isdir(path)}
    if state["exists"]:
        as_writer = writable_by(path, writer_pid)
        state["writable"] = as_writer if as_writer is not None else os.access(path, os.W_OK | os.X_OK)
        state["writable_as"] = f"process {writer_pid}" if as_writer is not None else "the probe's user"
        st = os.statvfs(path)
        state["read_only"] = bool(st.f_flag & os.ST_RDONLY)
        state["free_bytes"] = st.f_bavail * st.f_frsize
        state["free_ratio"] = (st.f_bavail / st.f_blocks) if st.f_blocks else 0.0
    return state


def _sysfs(path):
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def fabric_state(interfaces):
    """The RoCE data interfaces as this node sees them: each netdev's operstate and MTU (sysfs) and the RDMA links
    on it (`rdma -j link show`, iproute2)."""
    state = {"rdma_error": None, "interfaces": {}}
    try:
        done = subprocess.run(["rdma", "-j", "link", "show"], capture_output=True, text=True, timeout=10, check=False)
        links = json.loads(done.stdout or "[]") if done.returncode == 0 else []
        if done.returncode != 0:
            state["rdma_error"] = (done.stderr or "").strip() or f"exit {done.returncode}"
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        links, state["rdma_error"] = [], str(exc)
    for name in interfaces or ():
        base = f"/sys/class/net/{name}"
        if not os.path.isdir(base):
            state["interfaces"][name] = {"exists": False}
            continue
        mtu = _sysfs(f"{base}/mtu")
        state["interfaces"][name] = {
            "exists": True,
            "operstate": _sysfs(f"{base}/operstate"),
            "mtu": int(mtu) if mtu and mtu.isdigit() else None,
            "rdma": [
                {"device": link.get("ifname"), "port": link.get("port"), "state": link.get("state")}
                for link in links
                if link.get("netdev") == name
            ],
        }
    return state


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


# --- evaluators (pure) -------------------------------------------------------------------------------------------


def _flag(argv, name):
    for i, arg in enumerate(argv or ()):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def key_settings(services):
    """{setting: value} that must agree across nodes, from `running_service` of each service."""
    settings = {}
    for service, flags in KEY_FLAGS.items():
        argv = (services.get(service) or {}).get("argv")
        if argv is None:
            continue
        for flag, _kind in flags.items():
            settings[f"{service} {flag}"] = _flag(argv, flag) or "(default)"
    env = (services.get("lmcache") or {}).get("env") or {}
    for name in KEY_ENV:
        settings[f"lmcache {name}"] = env.get(name, "(unset)")
    return settings


def drift_code(setting):
    """CONFIG_DRIFT_<KIND> for a `key_settings` name."""
    service, name = setting.split(" ", 1)
    kind = KEY_FLAGS.get(service, {}).get(name) or KEY_ENV.get(name) or "OTHER"
    return f"CONFIG_DRIFT_{kind}"


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
    out += _p2p_checks(host, probe, expect)
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


def _p2p_checks(host, probe, expect):
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
    return [check(host, "l1_p2p", OK, "P2P_OK", f"registered, peers {', '.join(seen)}")]


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


def config_checks(host, services, want, want_fingerprint, others=None):
    """The running services' key settings against the spec's (`want`), naming what differs and where.

    `services`: {"lmcache": running_service, "vllm": running_service}; `others`: {host: key_settings} of the
    other nodes, shown next to a difference. A difference means zero hits between nodes, with no error.
    """
    down = [name for name in ("lmcache", "vllm") if not (services.get(name) or {}).get("argv")]
    if down:
        return [
            check(
                host,
                "config",
                UNVERIFIED,
                "CONFIG_UNREAD",
                f"{', '.join(down)} not running: its flags could not be compared",
                "see the serving checks",
            )
        ]
    have = key_settings(services)
    out = []
    for setting, value in sorted(have.items()):
        if setting not in want or value == want[setting]:
            continue
        peers = ", ".join(f"{o} {s.get(setting)}" for o, s in sorted((others or {}).items())) or "no other node read"
        out.append(
            check(
                host,
                "config",
                ERR,
                drift_code(setting),
                f"{setting} is {value} here, {want[setting]} in "
                f"kvtier_cluster ({peers}): its cache keys differ, so it gets no hits from the other nodes "
                "and they none from it",
                f"re-run spark.yml --limit {host} (the unit was changed outside kvtier)",
            )
        )
    running = ((services.get("lmcache") or {}).get("env") or {}).get("KVTIER_FINGERPRINT")
    if not out and running and want_fingerprint and running != want_fingerprint:
        out.append(
            check(
                host,
                "config",
                ERR,
                "CONFIG_DRIFT",
                "the running services were rendered from another cluster spec (their fingerprint differs)",
                f"re-run spark.yml --limit {host}",
            )
        )
    return out or [
        check(
            host,
            "config",
            OK,
            "CONFIG_OK",
            "the running model, dtype, block and chunk size and hash settings match kvtier_cluster",
        )
    ]


def load_order_checks(host, lmcache_service, expect):
    """The running LMCache's lower tiers in lookup order (its --l2-adapter flags) against their load times.

    LMCache loads a chunk from the first adapter that holds it, so a slower adapter listed first serves every hit
    that both hold. `expect["load_order"]`: fastest_first (tiers), seconds (tier -> one chunk's load), basis.
    """
    order = expect.get("load_order") or {}
    fastest, seconds = list(order.get("fastest_first") or []), order.get("seconds") or {}
    argv = (lmcache_service or {}).get("argv")
    if len(fastest) < 2 or not argv:
        return []
    by_adapter = {name: tier for tier, name in (expect.get("adapters") or {}).items()}
    running = []
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag != "--l2-adapter":
            continue
        try:
            tier = by_adapter.get(json.loads(value).get("type"))  # the type only: a valkey JSON holds its login
        except (ValueError, AttributeError):
            continue
        if tier in fastest and tier not in running:
            running.append(tier)
    late = [(a, b) for i, a in enumerate(running) for b in running[i + 1 :] if fastest.index(b) < fastest.index(a)]
    if not late:
        return [
            check(
                host,
                "config",
                OK,
                "LOAD_ORDER_OK",
                f"LMCache looks in {' then '.join(running)}, fastest first ({order.get('basis', 'estimated')})",
            )
        ]
    slow, fast = late[0]
    return [
        check(
            host,
            "config",
            WARN,
            "LOAD_ORDER_SLOW_FIRST",
            f"LMCache looks in {slow} before {fast}, which loads a chunk faster ({fast} "
            f"{seconds.get(fast, 0) * 1000:.3g} ms, {slow} {seconds.get(slow, 0) * 1000:.3g} ms, "
            f"{order.get('basis', 'estimated')}): every hit both hold comes from {slow}",
            "remove kvtier_cluster.load_order.tiers (or give load_order.measured_s from `kvtier bench ttft`) and "
            "re-run spark.yml",
        )
    ]


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


def l3_directory_checks(host, state):
    """The L3 directory on a Spark: there, writable, with free space."""
    path = state.get("path")
    if not state.get("exists"):
        return [
            check(
                host,
                "l3",
                ERR,
                "L3_DIR_MISSING",
                f"{path} does not exist: LMCache's fs adapter writes nothing",
                "mount the NFS export (nfs_client) and re-run spark.yml, which creates the directory",
            )
        ]
    if state.get("read_only") or not state.get("writable"):
        return [
            check(
                host,
                "l3",
                ERR,
                "L3_READ_ONLY",
                f"{path} is not writable by the serving user "
                f"({'read-only filesystem' if state.get('read_only') else 'permissions'}; "
                f"checked as {state.get('writable_as', 'the probe')})",
                "remount read-write / fix the owner (the export's squashed identity)",
            )
        ]
    return _free_checks(host, "l3", "L3", path, state)


def _free_checks(host, tier, prefix, path, state):
    ratio = state.get("free_ratio") or 0.0
    if ratio < FREE_ERR:
        return [
            check(
                host,
                tier,
                ERR,
                f"{prefix}_FULL",
                f"{path} has {ratio:.1%} free",
                "free space on the array (LMCache's fs adapter does not evict)",
            )
        ]
    if ratio < FREE_WARN:
        return [
            check(
                host,
                tier,
                WARN,
                f"{prefix}_FULL",
                f"{path} has {ratio:.1%} free",
                "free space on the array soon (LMCache's fs adapter does not evict)",
            )
        ]
    return [check(host, tier, OK, f"{prefix}_OK", f"{path} writable, {ratio:.0%} free")]


def nfs_checks(host, facts, rdma_expected=True, io_size=RSIZE_WANTED):
    """The L3 NFS mount's real transport (from kvtier_nfs.mount_facts)."""
    if not rdma_expected:
        return [
            check(
                host,
                "fabric",
                UNVERIFIED,
                "L3_NO_FABRIC",
                "this host has no RDMA fabric (kvtier_rdma_fabric: false): its L3 directory is not an NFS mount",
            )
        ]
    if not facts or not facts.get("mounted"):
        return [
            check(
                host,
                "l3",
                ERR,
                "L3_NOT_MOUNTED",
                "the L3 NFS export is not mounted",
                "re-run spark.yml (nfs_client); check the storage node's nfs-server",
            )
        ]
    out = []
    if facts.get("proto") != "rdma" or facts.get("xprt") not in (None, "rdma"):
        out.append(
            check(
                host,
                "l3",
                ERR,
                "L3_NOT_RDMA",
                f"the L3 mount runs over {facts.get('xprt') or facts.get('proto')}, "
                "not RDMA: it works, without the fabric",
                "check rdma_rxe/ConnectX, the RDMA listener (port 20049) and remount (nfs_client)",
            )
        )
    options = facts.get("options") or {}
    sizes = {key: int(options.get(key) or 0) for key in ("rsize", "wsize")}
    small = [f"{key} {value}" for key, value in sizes.items() if value and value < io_size]
    if small:
        out.append(
            check(
                host,
                "l3",
                WARN,
                "L3_RSIZE_SMALL",
                f"{' and '.join(small)} (want {io_size}): each RDMA transfer moves less",
                "mount with nfs_client_io_size (1 MiB); the server's nfsd caps it by its memory",
            )
        )
    return out or [check(host, "l3", OK, "L3_RDMA_OK", f"NFS {facts.get('vers')} over RDMA")]


def fabric_checks(host, state, mtu):
    """Each RoCE data interface (from `fabric_state`): the netdev up at the fabric's MTU (roce_mtu), an RDMA link
    on it, ACTIVE. Every node is checked against the same MTU, so both ends of every path agree."""
    if not state or not state.get("interfaces"):
        return [
            check(
                host,
                "fabric",
                UNVERIFIED,
                "FABRIC_UNKNOWN",
                "the RoCE data interfaces were not read (roce_interface unset, or the node was not reached)",
                "set roce_interface for the host",
            )
        ]
    out = []
    for name, nic in sorted(state["interfaces"].items()):
        if not nic.get("exists"):
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_NETDEV_MISSING",
                    f"{name} does not exist",
                    "check roce_interface (roce_extra_interfaces) and the NIC driver: `ip link`",
                )
            )
            continue
        found = len(out)
        if nic.get("operstate") in ("down", "lowerlayerdown", "notpresent"):
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_LINK_DOWN",
                    f"{name} is {nic.get('operstate')}: no traffic passes",
                    "check the cable and the switch port; re-run the roce role",
                )
            )
        if mtu and nic.get("mtu") != mtu:
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_MTU",
                    f"{name} has MTU {nic.get('mtu')}, the fabric's is {mtu} (roce_mtu): RDMA's path MTU follows the "
                    "netdev's, and a hop with a smaller MTU drops the larger frames",
                    "re-run the roce role; every host and switch port must carry roce_mtu",
                )
            )
        active = [link for link in nic.get("rdma") or [] if link.get("state") == "ACTIVE"]
        if not nic.get("rdma"):
            unread = f" (rdma link show: {state['rdma_error']})" if state.get("rdma_error") else ""
            out.append(
                check(
                    host,
                    "fabric",
                    UNVERIFIED if state.get("rdma_error") else ERR,
                    "FABRIC_NO_RDMA",
                    f"no RDMA device on {name}{unread}: NFS and P2P cannot use RDMA",
                    "load the NIC's RDMA driver (mlx5_ib) or soft-RoCE (roce_soft_roce); install iproute2 for `rdma`",
                )
            )
        elif not active:
            states = ", ".join(f"{link.get('device')}/{link.get('port')} {link.get('state')}" for link in nic["rdma"])
            out.append(
                check(
                    host,
                    "fabric",
                    ERR,
                    "FABRIC_RDMA_DOWN",
                    f"the RDMA link on {name} is not ACTIVE ({states})",
                    "check the link (`rdma link show`, `ibv_devinfo`) and the switch port",
                )
            )
        if len(out) == found:
            links = ", ".join(f"{link.get('device')}/{link.get('port')}" for link in active)
            out.append(check(host, "fabric", OK, "FABRIC_OK", f"{links} ACTIVE on {name}, MTU {nic.get('mtu')}"))
    return out


def named_array(arrays, name):
    """The md array called `name` (its md_name is host:name or name) from kvtier_nvme facts, or None."""
    found = [a for a in (arrays or {}).values() if str(a.get("md_name") or "").split(":")[-1] == name]
    return found[0] if found else None


def array_mount_state(arrays, name):
    """`directory_state` of the named array's first mount (run on the storage node), or None."""
    targets = [m.get("target") for m in (named_array(arrays, name) or {}).get("mounts") or [] if m.get("target")]
    return directory_state(targets[0]) if targets else None


def array_checks(host, arrays, name, mount_state):
    """The L3 backing array (from kvtier_nvme facts) and its XFS mount."""
    array = named_array(arrays, name)
    if array is None:
        return [
            check(
                host,
                "storage",
                ERR,
                "ARRAY_MISSING",
                f"no md array named {name}",
                "run storage.yml (nvme_raid adopts or creates it); `cat /proc/mdstat`",
            )
        ]
    out = []
    if array.get("health") != "healthy":
        missing = ", ".join(array.get("missing_serials") or []) or "unknown"
        out.append(
            check(
                host,
                "storage",
                ERR,
                "ARRAY_DEGRADED",
                f"{array.get('device')} is {array.get('health')}, "
                f"missing drive(s) {missing}: a RAID0 without a member has lost its data",
                "replace the drive and rebuild the array with nvme_raid (the cache starts empty)",
            )
        )
    else:
        out.append(
            check(
                host,
                "storage",
                OK,
                "ARRAY_OK",
                f"{array.get('device')} {array.get('level')} of "
                f"{array.get('raid_disks')} drives ({', '.join(array.get('member_serials') or [])})",
            )
        )
    mounts = array.get("mounts") or []
    if not mounts:
        out.append(
            check(
                host,
                "storage",
                ERR,
                "XFS_NOT_MOUNTED",
                f"{array.get('device')} is not mounted",
                "run storage.yml (it mounts the array by UUID)",
            )
        )
    elif mount_state is not None:
        out += _free_checks(host, "storage", "XFS", mounts[0].get("target"), mount_state)
    return out


def spark_checks(host, facts, expect):
    """Every check of one Spark from what was gathered on it, the same for the module and `kvtier health`.

    `facts`: probe (`probe_node`), later (`lmcache_summary` a second after), lmcache (`running_service` of the
    LMCache server), l2 (`client_view` as LMCache's user), l3 (`directory_state`), nfs (`mount_facts`), fabric
    (`fabric_state`), l2_lmcache (`lmcache_l2_view`); any may be missing. `expect`: model, adapters, load_order,
    p2p_peers, plus l2 (LMCache has an L2 tier), l3 (it has an L3 tier), rdma_fabric (the L3 directory is an NFS
    mount), io_size (the mount's rsize/wsize) and mtu (the fabric's).
    """
    probe = facts.get("probe") or {}
    out = serving_checks(host, probe, expect)
    out += store_gap_checks(host, probe.get("lmcache"), expect, facts.get("later"))
    out += load_order_checks(host, facts.get("lmcache"), expect)
    if "l2" in facts:
        out += l2_checks(host, facts["l2"])
        out += l2_login_checks(host, facts.get("l2_lmcache"))
        out += l2_restart_checks(host, facts["l2"], facts.get("lmcache"), (expect.get("adapters") or {}).get("l2"))
    elif facts.get("l2_lmcache"):
        # No password given: LMCache's own login is probed alone, and it is how LMCache sees L2.
        out += l2_checks(host, facts["l2_lmcache"])
        out += l2_restart_checks(
            host, facts["l2_lmcache"], facts.get("lmcache"), (expect.get("adapters") or {}).get("l2")
        )
    elif expect.get("l2"):
        out.append(
            check(
                host,
                "l2",
                UNVERIFIED,
                "L2_PASSWORD_UNKNOWN",
                "no L2 password was given and the LMCache server's own login could not be read, so no login was tried",
                "pass the vault password (--vault-password-file) or the module's l2_password",
                name="l2",
            )
        )
    if "l3" in facts:
        out += l3_directory_checks(host, facts["l3"])
    if expect.get("l3"):
        out += nfs_checks(
            host, facts.get("nfs"), expect.get("rdma_fabric", True), expect.get("io_size") or RSIZE_WANTED
        )
    if expect.get("rdma_fabric", True) and "fabric" in facts:
        out += fabric_checks(host, facts["fabric"], expect.get("mtu"))
    return out


def exit_status(checks):
    """0 when no check is ERR, else 1."""
    return 1 if any(c["status"] == ERR for c in checks) else 0
