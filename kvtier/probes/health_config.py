"""Health of a Spark's configuration: the running LMCache and vLLM services read from /proc (gathered on the
node), the settings that make cache keys equal on every node, and the lower tiers' load order."""

from __future__ import annotations

import json
import os
import subprocess

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, UNVERIFIED, WARN, check
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, UNVERIFIED, WARN, check


# The flags of the running services that make cache keys equal on every node (what LMCache hashes, and the
# KV layout vLLM hands it); a difference between nodes means zero hits with no error.
KEY_FLAGS = {
    "lmcache": {"--chunk-size": "CHUNK", "--hash-algorithm": "HASH"},
    "vllm": {"--model": "MODEL", "--dtype": "DTYPE", "--block-size": "BLOCK", "--kv-cache-dtype": "DTYPE"},
}

KEY_ENV = {"PYTHONHASHSEED": "HASH"}


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
