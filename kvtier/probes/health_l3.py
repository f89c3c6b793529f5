"""Health of the L3 tier (the NVMe pool over NFS): the L3 directory as LMCache's process may write it (gathered on
the node), its free space, and the mount's transport and I/O size."""

from __future__ import annotations

import os
import time

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, UNVERIFIED, WARN, check
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, UNVERIFIED, WARN, check


FREE_WARN, FREE_ERR = 0.10, 0.02
# The L3 evictor's last run older than this: it has stopped (its timer runs every minute by default).
EVICTOR_STALE_S = 900

RSIZE_WANTED = 1048576


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
    return free_checks(host, "l3", "L3", path, state)


def free_checks(host, tier, prefix, path, state):
    ratio = state.get("free_ratio") or 0.0
    if ratio < FREE_ERR:
        return [
            check(
                host,
                tier,
                ERR,
                f"{prefix}_FULL",
                f"{path} has {ratio:.1%} free",
                "LMCache does not evict L3: check kvtier-l3-evictor.timer on its host "
                "(playbooks/l3_evictor.yml) and that its budget fits the array",
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
                "LMCache does not evict L3: check that kvtier-l3-evictor.timer runs "
                "(playbooks/l3_evictor.yml) and that its budget fits the array",
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


def evictor_state(textfile):
    """The L3 evictor's last run, from the node_exporter textfile it writes: {path, found, values, age_s}."""
    try:
        with open(textfile, encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {"path": textfile, "found": False}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("kvtier_l3_"):
            try:
                values[name] = float(value)
            except ValueError:
                continue
    last = values.get("kvtier_l3_evictor_last_run_timestamp_seconds")
    return {"path": textfile, "found": True, "values": values, "age_s": None if last is None else time.time() - last}


def size_text(n):
    """Bytes as MiB, or GiB from 1 GiB on (how the evictor check words sizes)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def evictor_checks(host, state, stale_after_s=EVICTOR_STALE_S):
    """The L3 pool's fill against the evictor's watermarks, and whether the evictor still runs (on its host)."""
    fix = "ansible-playbook playbooks/l3_evictor.yml; on its host: systemctl status kvtier-l3-evictor.timer"
    if not state.get("found"):
        return [
            check(
                host,
                "l3",
                WARN,
                "L3_EVICTOR_MISSING",
                f"no L3 evictor run recorded ({state.get('path')} is missing): nothing removes L3 chunks, and the "
                "pool fills until stores fail",
                fix,
                name="evictor",
            )
        ]
    v, age = state.get("values") or {}, state.get("age_s")
    used, budget = v.get("kvtier_l3_used_bytes", 0), v.get("kvtier_l3_budget_bytes", 0)
    high, low = v.get("kvtier_l3_high_watermark_bytes", 0), v.get("kvtier_l3_low_watermark_bytes", 0)
    fill = (
        f"the pool holds {size_text(used)} of its {size_text(budget)} budget "
        f"({used / budget:.0%}; high watermark {size_text(high)}, low {size_text(low)})"
        if budget
        else "the evictor recorded no budget"
    )
    if age is None or age > stale_after_s:
        when = "never" if age is None else f"{age / 60:.0f} min ago"
        return [
            check(
                host,
                "l3",
                WARN,
                "L3_EVICTOR_STALE",
                f"the L3 evictor last ran {when}: {fill} as of then, and nothing removes chunks meanwhile",
                fix,
                name="evictor",
            )
        ]
    if budget and used > high:
        return [
            check(
                host,
                "l3",
                WARN,
                "L3_OVER_BUDGET",
                f"after the evictor's last run {fill}: it cannot remove enough (chunks younger than its minimum "
                "age, or stores faster than it runs)",
                "raise l3_evictor_budget_bytes/fraction if the array has room, or run the evictor more often "
                "(l3_evictor_interval); playbooks/l3_evictor.yml",
                name="evictor",
            )
        ]
    removed = v.get("kvtier_l3_evicted_chunks_total")
    said = f"; {removed:.0f} chunks removed in all" if removed is not None else ""
    return [check(host, "l3", OK, "L3_EVICTOR_OK", f"{fill}; last run {age:.0f} s ago{said}", name="evictor")]
