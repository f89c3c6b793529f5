"""Health checks: facts gathered on a node turned into named checks, each with a stable code and its fix.

One module per tier (kvtier/probes/health_<tier>.py), this one composes a Spark's checks and names them all, for
kvtier's CLI, the kvtier_health module (module_utils/kvtier_health*.py) and the scripts shipped to nodes. Standard
library only: the gatherers (`running_service`, `directory_state`, ...) run on the nodes, the evaluators are pure
functions over the facts the probes return (`kvtier_lmcache.probe_node`, `kvtier_nfs`, `kvtier_nvme`, RESP INFO).
Every check is a dict:

    {"host", "tier", "check", "status", "code", "reason", "fix"}

tier:   l0, l1_p2p, l2, l3, fabric, storage, serving, config (kvtier's tier names; LMCache's own words only
        where its counters are meant).
check:  what is checked, the same whatever it finds (one metric series per check).
status: OK, WARN, ERR, or UNVERIFIED when the check could not run (the reason says why: never a false OK).
"""

from __future__ import annotations

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_config import (
        CONTAINER_ENGINES,
        KEY_ENV,
        KEY_FLAGS,
        config_checks,
        container_process,
        drift_code,
        key_settings,
        load_order_checks,
        process_started_at,
        running_service,
    )
    from ansible.module_utils.kvtier_health_core import (
        ERR,
        OK,
        STATUSES,
        UNVERIFIED,
        WARN,
        check,
        exit_status,
    )
    from ansible.module_utils.kvtier_health_fabric import (
        fabric_checks,
        fabric_state,
    )
    from ansible.module_utils.kvtier_health_l2 import (
        L2_LATENCY_WARN_MS,
        L2_LOGIN_ENV,
        L2_MEMORY_WARN,
        L2_RESTART_MARGIN_S,
        env_file_l2_login,
        l2_checks,
        l2_login_checks,
        l2_restart_checks,
        lmcache_l2_view,
        process_l2_login,
    )
    from ansible.module_utils.kvtier_health_l3 import (
        EVICTOR_STALE_S,
        FREE_ERR,
        FREE_WARN,
        RSIZE_WANTED,
        directory_state,
        evictor_checks,
        evictor_state,
        free_checks,
        l3_directory_checks,
        nfs_checks,
        process_credentials,
        writable_by,
    )
    from ansible.module_utils.kvtier_health_p2p import (
        coordinator_checks,
        coordinator_state,
        p2p_checks,
    )
    from ansible.module_utils.kvtier_health_serving import (
        STORE_GAP_FRACTION,
        serving_checks,
        store_gap_checks,
    )
    from ansible.module_utils.kvtier_health_storage import (
        array_checks,
        array_mount_state,
        named_array,
    )
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_config import (
        CONTAINER_ENGINES,
        KEY_ENV,
        KEY_FLAGS,
        config_checks,
        container_process,
        drift_code,
        key_settings,
        load_order_checks,
        process_started_at,
        running_service,
    )
    from kvtier.probes.health_core import (
        ERR,
        OK,
        STATUSES,
        UNVERIFIED,
        WARN,
        check,
        exit_status,
    )
    from kvtier.probes.health_fabric import (
        fabric_checks,
        fabric_state,
    )
    from kvtier.probes.health_l2 import (
        L2_LATENCY_WARN_MS,
        L2_LOGIN_ENV,
        L2_MEMORY_WARN,
        L2_RESTART_MARGIN_S,
        env_file_l2_login,
        l2_checks,
        l2_login_checks,
        l2_restart_checks,
        lmcache_l2_view,
        process_l2_login,
    )
    from kvtier.probes.health_l3 import (
        EVICTOR_STALE_S,
        FREE_ERR,
        FREE_WARN,
        RSIZE_WANTED,
        directory_state,
        evictor_checks,
        evictor_state,
        free_checks,
        l3_directory_checks,
        nfs_checks,
        process_credentials,
        writable_by,
    )
    from kvtier.probes.health_p2p import (
        coordinator_checks,
        coordinator_state,
        p2p_checks,
    )
    from kvtier.probes.health_serving import (
        STORE_GAP_FRACTION,
        serving_checks,
        store_gap_checks,
    )
    from kvtier.probes.health_storage import (
        array_checks,
        array_mount_state,
        named_array,
    )

__all__ = [
    "CONTAINER_ENGINES",
    "ERR",
    "EVICTOR_STALE_S",
    "FREE_ERR",
    "FREE_WARN",
    "KEY_ENV",
    "KEY_FLAGS",
    "L2_LATENCY_WARN_MS",
    "L2_LOGIN_ENV",
    "L2_MEMORY_WARN",
    "L2_RESTART_MARGIN_S",
    "OK",
    "RSIZE_WANTED",
    "STATUSES",
    "STORE_GAP_FRACTION",
    "UNVERIFIED",
    "WARN",
    "array_checks",
    "array_mount_state",
    "check",
    "config_checks",
    "container_process",
    "coordinator_checks",
    "coordinator_state",
    "directory_state",
    "drift_code",
    "env_file_l2_login",
    "evictor_checks",
    "evictor_state",
    "exit_status",
    "fabric_checks",
    "fabric_state",
    "free_checks",
    "key_settings",
    "l2_checks",
    "l2_login_checks",
    "l2_restart_checks",
    "l3_directory_checks",
    "lmcache_l2_view",
    "load_order_checks",
    "named_array",
    "nfs_checks",
    "p2p_checks",
    "process_credentials",
    "process_l2_login",
    "process_started_at",
    "running_service",
    "serving_checks",
    "spark_checks",
    "store_gap_checks",
    "writable_by",
]


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
