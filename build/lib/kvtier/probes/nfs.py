"""NFS mounts: which transport a mount really uses, from /proc/mounts and /proc/self/mountstats.

Used by the `nfs_mount_facts` module (shipped as module_utils/kvtier_nfs.py, so standard library only)
and by the kvtier CLI. The ``parse_*`` functions take text and are pure; `mount_facts` reads a live
system (or recorded files, through ``mounts_path`` and ``mountstats_path``).

Why both sources: /proc/mounts gives the options the mount was made with (``proto=rdma``); the
``xprt:`` line of /proc/self/mountstats names the transport the RPC client actually runs on, with its
counters (sends, receives and, for RDMA, chunk and memory-registration counts). A mount that fell back
to TCP shows ``proto=tcp`` and ``xprt: tcp``, and keeps working, just without the fabric.
"""

from __future__ import annotations

import re

MOUNTS = "/proc/mounts"
MOUNTSTATS = "/proc/self/mountstats"
NFS_TYPES = ("nfs", "nfs4")

# Fields of the `xprt:` line after the transport name (net/sunrpc/xprtsock.c, xprtrdma/transport.c).
XPRT_COMMON = (
    "port",
    "bind_count",
    "connect_count",
    "connect_time",
    "idle_time",
    "sends",
    "recvs",
    "bad_xids",
    "req_u",
    "bklog_u",
)
XPRT_FIELDS = {
    "tcp": XPRT_COMMON + ("max_slots", "sending_u", "pending_u"),
    "udp": (
        "port",
        "bind_count",
        "sends",
        "recvs",
        "bad_xids",
        "req_u",
        "bklog_u",
        "max_slots",
        "sending_u",
        "pending_u",
    ),
    "rdma": XPRT_COMMON
    + (
        "read_chunk_count",
        "write_chunk_count",
        "reply_chunk_count",
        "total_rdma_request",
        "total_rdma_reply",
        "pullup_copy_count",
        "fixup_copy_count",
        "hardway_register_count",
        "failed_marshal_count",
        "bad_reply_count",
        "nomsg_call_count",
        "mrs_recycled",
        "mrs_orphaned",
        "mrs_allocated",
        "local_inv_needed",
        "empty_sendctx_q",
        "reply_waits_for_send",
    ),
}

NOT_RDMA = (
    "{path} is an NFS mount over {transport}, not RDMA (proto={proto}, xprt {xprt}): the mount fell back or was made "
    "without proto=rdma. Check on this host that the RDMA link on the data interface is ACTIVE (`rdma link show`) and "
    "that rpcrdma is loaded, and on the server that /proc/fs/nfsd/portlist lists 'rdma {port}'; then remount "
    "(umount {path} && mount {path}). Set nfs_client_allow_tcp: true only if TCP is acceptable here."
)


class MountError(Exception):
    """The system cannot be probed; the message says what to fix."""


def _unescape(field):
    # /proc/mounts escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_options(text):
    """'rw,vers=4.2,proto=rdma' -> {'rw': True, 'vers': '4.2', 'proto': 'rdma'}."""
    opts = {}
    for item in text.split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        opts[key] = value if sep else True
    return opts


def parse_mounts(text):
    """All entries of /proc/mounts, in order (the last one on a path is the visible one)."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        entries.append(
            {
                "source": _unescape(fields[0]),
                "path": _unescape(fields[1]),
                "fstype": fields[2],
                "options": parse_options(fields[3]),
            }
        )
    return entries


def parse_xprt(line):
    """'xprt:\\trdma 0 0 1 ...' -> {'transport': 'rdma', 'counters': {...}, 'raw': [...]}."""
    parts = line.split()
    if not parts or parts[0] != "xprt:" or len(parts) < 2:
        raise ValueError("not an xprt line: %r" % line)
    transport = parts[1]
    values = [int(v) for v in parts[2:]]
    names = XPRT_FIELDS.get(transport, ())
    if len(values) != len(names):
        # Another kernel's layout: keep the fields every transport shares, plus the raw values.
        names = XPRT_COMMON if transport != "udp" else XPRT_FIELDS["udp"]
    return {"transport": transport, "counters": dict(zip(names, values, strict=False)), "raw": values}


def parse_mountstats(text):
    """/proc/self/mountstats -> list of {source, path, fstype, statvers, options, xprts, age}, NFS mounts only."""
    stats = []
    current = None
    header = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?")
    for line in text.splitlines():
        match = header.match(line)
        if match:
            current = None
            if match.group(3) in NFS_TYPES:
                current = {
                    "source": _unescape(match.group(1)),
                    "path": _unescape(match.group(2)),
                    "fstype": match.group(3),
                    "statvers": match.group(4),
                    "options": {},
                    "xprts": [],
                    "age": None,
                }
                stats.append(current)
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("opts:"):
            current["options"] = parse_options(stripped[len("opts:") :].strip())
        elif stripped.startswith("age:"):
            current["age"] = int(stripped.split()[1])
        elif stripped.startswith("xprt:"):
            current["xprts"].append(parse_xprt(stripped))
    return stats


def describe(path, mounts_text, mountstats_text):
    """Facts about the NFS mount visible at ``path``; ``mounted`` is False when there is none."""
    path = path.rstrip("/") or "/"
    entries = [m for m in parse_mounts(mounts_text) if m["path"] == path]
    facts = {
        "path": path,
        "mounted": bool(entries),
        "nfs": False,
        "source": None,
        "fstype": None,
        "options": {},
        "proto": None,
        "port": None,
        "vers": None,
        "xprt": None,
        "xprts": [],
        "rdma": False,
    }
    if not entries:
        return facts
    entry = entries[-1]
    opts = entry["options"]
    facts.update(source=entry["source"], fstype=entry["fstype"], options=opts, nfs=entry["fstype"] in NFS_TYPES)
    if not facts["nfs"]:
        return facts
    facts.update(
        proto=opts.get("proto"),
        vers=opts.get("vers"),
        port=int(opts["port"]) if str(opts.get("port", "")).isdigit() else None,
    )
    stats = [s for s in parse_mountstats(mountstats_text) if s["path"] == path]
    if stats:
        facts["xprts"] = stats[-1]["xprts"]
        facts["xprt"] = facts["xprts"][0]["transport"] if facts["xprts"] else None
    facts["rdma"] = (
        facts["proto"] == "rdma" and bool(facts["xprts"]) and all(x["transport"] == "rdma" for x in facts["xprts"])
    )
    return facts


def problems(facts, allow_tcp=False, port=None, vers=None, io_size=None):
    """Reasons the mount is not acceptable, as messages that say what to fix (empty when it is). With `io_size`,
    rsize and wsize in force must be at least that many bytes (the server can lower what the client asked)."""
    path = facts["path"]
    if not facts["mounted"]:
        return [
            "nothing is mounted at %s: run `mount %s` and read the kernel log (dmesg) for the reason" % (path, path)
        ]
    if not facts["nfs"]:
        return ["%s is a %s mount of %s, not NFS" % (path, facts["fstype"], facts["source"])]
    found = []
    if vers and facts["vers"] != vers:
        found.append("%s is mounted with NFS vers=%s, expected vers=%s (remount it)" % (path, facts["vers"], vers))
    if not facts["rdma"]:
        if not facts["xprts"] and facts["proto"] == "rdma":
            found.append(
                "%s says proto=rdma but /proc/self/mountstats has no xprt line for it yet; "
                "run I/O on it and probe again" % path
            )
        elif not allow_tcp:
            xprt = "+".join(sorted({x["transport"] for x in facts["xprts"]})) or None
            transport = xprt or facts["proto"] or "unknown"
            found.append(
                NOT_RDMA.format(
                    path=path, transport=transport.upper(), proto=facts["proto"], xprt=xprt, port=port or 20049
                )
            )
    elif port and facts["port"] != port:
        found.append("%s uses RDMA on port %s, expected %s (the server's rdma-port)" % (path, facts["port"], port))
    if io_size:
        sizes = {k: int(facts["options"].get(k) or 0) for k in ("rsize", "wsize")}
        small = ["%s=%d" % (k, v) for k, v in sorted(sizes.items()) if v < io_size]
        if small:
            found.append(
                "%s is mounted with %s, below %d bytes: each chunk then takes several round trips. Remount it "
                "(umount %s && mount %s); if it stays lower, the server caps it (/proc/fs/nfsd/max_block_size)"
                % (path, " ".join(small), io_size, path, path)
            )
    return found


def mount_point_of(path, mounts_text):
    """The mount point under which ``path`` lives (the longest one that contains it), "/" at worst."""
    path = path.rstrip("/") or "/"
    best = "/"
    for entry in parse_mounts(mounts_text):
        point = entry["path"].rstrip("/") or "/"
        if (path == point or path.startswith(point + "/") or point == "/") and len(point) > len(best):
            best = point
    return best


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as err:
        raise MountError("cannot read %s: %s" % (path, err)) from err


def mount_facts(path, mounts_path=MOUNTS, mountstats_path=MOUNTSTATS):
    return describe(path, read(mounts_path), read(mountstats_path))
