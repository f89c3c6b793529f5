"""NVMe drives and md arrays of a storage node: identity, geometry, what each drive holds, array health.

Used by the `nvme_facts` module (shipped as module_utils/kvtier_nvme.py, so standard library only) and
by the kvtier CLI. The ``parse_*`` functions and `drive_facts`/`md_facts` take text or plain data and are
pure; `collect` is the thin layer that reads a system (a live one, or a recorded tree under ``root``
with recorded command output through ``run``).

Why each source: nvme-cli for identity (serial, model, firmware, LBA formats), sysfs for what the kernel
does with the drive (queue limits, partitions, holders, md state), blkid for on-disk signatures,
/proc/mounts for use. A hot-removed md member vanishes from sysfs and udev, so its serial can only come
from a record written while the array was healthy (see `md_record`).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess

SECTOR = 512  # sysfs `size` is always in 512-byte units, whatever the LBA size
QUEUE_ATTRS = ("logical_block_size", "physical_block_size", "minimum_io_size", "optimal_io_size")
RECORD_DIR = "/var/lib/kvtier/md"
# Members an array can lose and still serve I/O; raid1 can lose all but one.
TOLERANCE = {"raid0": 0, "linear": 0, "raid4": 1, "raid5": 1, "raid6": 2}


class ProbeError(Exception):
    """The system cannot be probed; the message says what to install or fix."""


# -- parsers ------------------------------------------------------------------------------------------


def _doc(doc):
    if isinstance(doc, bytes):
        doc = doc.decode()
    if isinstance(doc, str):
        return json.loads(doc) if doc.strip() else {}
    return doc or {}


def _text(value):
    # Identify data is space-padded (model to 40, serial to 20 characters).
    return value.strip() if isinstance(value, str) else value


def _namespace(ns, ctrl):
    """One namespace from the nested layout, with the identity of the controller it hangs off."""
    name = _text(ns.get("NameSpace"))
    return {
        "name": name,
        "device": "/dev/" + name,
        "nsid": ns.get("NSID"),
        "serial": _text(ctrl.get("SerialNumber")),
        "model": _text(ctrl.get("ModelNumber")),
        "firmware": _text(ctrl.get("Firmware")),
        "controller": _text(ctrl.get("Controller")),
        "transport": _text(ctrl.get("Transport")),
        "address": _text(ctrl.get("Address")),
        "sector_size": ns.get("SectorSize"),
        "nvme_size_bytes": ns.get("PhysicalSize"),
    }


def parse_nvme_list(doc) -> list:
    """Namespaces from `nvme list -o json`, in either layout.

    Flat (nvme-cli 2.x plain, e.g. 2.3 on Debian 12; GenericPath only in newer ones):
    ``Devices[]`` = one namespace each, ``NameSpace`` being the NSID.
    Nested (``-v``, and newer releases): ``Devices[].Subsystems[].Controllers[].Namespaces[]`` with
    ``NameSpace`` the kernel name; with native multipath the namespaces hang off the subsystem instead,
    each with its ``Paths`` (v2) or the subsystem's controllers (v1) carrying the identity.
    """
    out = []
    for dev in _doc(doc).get("Devices", []):
        if "Subsystems" not in dev:
            path = _text(dev.get("DevicePath", ""))
            out.append(
                {
                    "name": os.path.basename(path),
                    "device": path,
                    "nsid": dev.get("NameSpace"),
                    "serial": _text(dev.get("SerialNumber")),
                    "model": _text(dev.get("ModelNumber")),
                    "firmware": _text(dev.get("Firmware")),
                    "controller": None,
                    "transport": None,
                    "address": None,
                    "sector_size": dev.get("SectorSize"),
                    "nvme_size_bytes": dev.get("PhysicalSize"),
                }
            )
            continue
        for subsys in dev["Subsystems"]:
            ctrls = subsys.get("Controllers") or []
            for ctrl in ctrls:
                out.extend(_namespace(ns, ctrl) for ns in ctrl.get("Namespaces") or [])
            for ns in subsys.get("Namespaces") or []:
                paths = [p for p in ns.get("Paths") or [] if isinstance(p, dict) and p.get("SerialNumber")]
                ident = paths[0] if paths else (ctrls[0] if ctrls else {})
                out.append(_namespace(ns, ident))
    return sorted(out, key=lambda d: d["name"])


def lba_format_in_use(flbas: int, nlbaf: int) -> int:
    """Index of the LBA format in use: FLBAS bits 3:0, plus bits 6:5 as the high bits past 16 formats."""
    index = flbas & 0xF
    if nlbaf >= 16:
        index |= ((flbas >> 5) & 0x3) << 4
    return index


def parse_id_ns(doc) -> dict:
    """LBA formats from `nvme id-ns -o json`: data size, metadata size, relative performance, in use."""
    d = _doc(doc)
    nlbaf = d.get("nlbaf", 0)  # zero-based count
    in_use = lba_format_in_use(d.get("flbas", 0), nlbaf)
    formats = []
    for i, f in enumerate(d.get("lbafs", [])[: nlbaf + 1]):
        formats.append(
            {
                "index": f.get("lbaf", i),
                "data_size": 1 << f["ds"] if f.get("ds") else 0,  # ds 0 = format not available
                "metadata_size": f.get("ms", 0),
                "relative_performance": f.get("rp", 0),
                "in_use": bool(f["in_use"]) if "in_use" in f else i == in_use,
            }
        )
    return {"lba_formats": formats, "lba_format_in_use": in_use}


def parse_blkid_export(text: str) -> dict:
    """`blkid -p -o export DEV` -> lower-case keys (type, usage, uuid, label, pttype, ...)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4:
            out.append({"source": _unescape(f[0]), "target": _unescape(f[1]), "fstype": f[2], "options": f[3]})
    return out


def parse_mdstat(text: str) -> dict:
    """/proc/mdstat -> {md0: {active, level, members: {name: {role, flags}}, blocks, chunk_kib, ...}}."""
    arrays, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^(md\S+)\s*:\s*(\S+)\s*(.*)$", line)
        if m:
            words = m.group(3).split()
            entry = {"active": m.group(2) == "active", "read_only": None, "level": None, "members": {}}
            while words and words[0].startswith("("):  # e.g. (auto-read-only)
                entry["read_only"] = words.pop(0).strip("()")
            if entry["active"] and words and "[" not in words[0]:
                entry["level"] = words.pop(0)
            for w in words:
                dm = re.match(r"^([^\[]+)\[(\d+)\]((?:\([A-Za-z]+\))*)$", w)
                if dm:
                    flags = re.findall(r"\(([A-Za-z]+)\)", dm.group(3))
                    entry["members"][dm.group(1)] = {"role": int(dm.group(2)), "flags": flags}
            arrays[m.group(1)] = current = entry
            continue
        if current is not None and line.startswith((" ", "\t")):
            blocks = re.search(r"(\d+) blocks", line)
            if blocks and "blocks" not in current:
                current["blocks"] = int(blocks.group(1))
            chunk = re.search(r"(\d+)k chunks?", line)
            if chunk:
                current["chunk_kib"] = int(chunk.group(1))
            counts = re.search(r"\[(\d+)/(\d+)\]\s+\[([U_]+)\]", line)
            if counts:
                current["raid_disks"], current["working"] = int(counts.group(1)), int(counts.group(2))
                current["up"] = counts.group(3)
        elif not line.strip():
            current = None
    return arrays


def parse_mdadm_export(text: str) -> dict:
    """`mdadm --detail --export /dev/mdX`. It has no chunk size (read md/chunk_size from sysfs) and
    lists only the members that are still there."""
    raw = parse_blkid_export(text)
    members = {}
    for key, value in raw.items():
        m = re.match(r"^md_device_(.+)_role$", key)
        if m:
            dev = raw.get("md_device_%s_dev" % m.group(1), "")
            members[os.path.basename(dev) or m.group(1)] = value
    return {
        "level": raw.get("md_level"),
        "raid_disks": int(raw["md_devices"]) if raw.get("md_devices", "").isdigit() else None,
        "metadata": raw.get("md_metadata"),
        "uuid": raw.get("md_uuid"),
        "md_name": raw.get("md_name"),
        "members": members,
    }


def by_id_path(links: dict, name: str, serial: str | None) -> str | None:
    """The stable /dev/disk/by-id path of `name`, given {link name: kernel name} of that directory.

    Prefers ``nvme-<model>_<serial>`` (what operators read on the drive label), then the same with the
    namespace suffix ``_<nsid>``, then the EUI/NGUID forms.
    """
    mine = sorted(link for link, target in links.items() if target == name and link.startswith("nvme-"))

    def rank(link):
        if serial and link.endswith("_" + serial):
            return 0
        if serial and re.search(re.escape("_" + serial) + r"_\d+$", link):
            return 1
        return 2

    mine.sort(key=rank)
    return "/dev/disk/by-id/" + mine[0] if mine else None


# -- block-device graph ---------------------------------------------------------------------------------


def users(graph: dict, name: str) -> list:
    """Everything stacked on `name`: its partitions and holders (md, dm), recursively, in BFS order."""
    seen, todo = [], [name]
    while todo:
        cur = todo.pop(0)
        node = graph.get(cur, {})
        for nxt in node.get("partitions", []) + node.get("holders", []):
            if nxt not in seen and nxt != name:
                seen.append(nxt)
                todo.append(nxt)
    return seen


def drive_facts(ns: dict, graph: dict, queue: dict, signatures: dict, mounts: list, root_dev, links: dict) -> dict:
    """Facts for one NVMe namespace and what it holds.

    signatures: {kernel name: blkid dict} for the drive and its partitions; mounts: parse_mounts() with
    each source already resolved to a kernel name in ``dev``; root_dev: kernel name behind "/".
    """
    name = ns["name"]
    stacked = users(graph, name)
    drive = dict(ns)
    drive["by_id"] = by_id_path(links, name, ns.get("serial"))
    drive["size_bytes"] = graph.get(name, {}).get("size_sectors", 0) * SECTOR
    drive.update(queue)
    drive["partitions"] = list(graph.get(name, {}).get("partitions", []))
    drive["signatures"] = [dict(sig, device="/dev/" + dev) for dev, sig in sorted(signatures.items()) if sig]
    drive["md_arrays"] = [d for d in stacked if d.startswith("md") and graph.get(d, {}).get("md")]
    drive["holders"] = [d for d in stacked if d not in drive["partitions"]]
    drive["mounts"] = [
        {"target": m["target"], "source": m["source"], "fstype": m["fstype"], "via": m["dev"]}
        for m in mounts
        if m.get("dev") in stacked + [name]
    ]
    drive["backs_root"] = root_dev is not None and root_dev in stacked + [name]
    reasons = []
    if drive["backs_root"]:
        reasons.append("backs the root filesystem")
    reasons += ["mounted at %s (via %s)" % (m["target"], m["via"]) for m in drive["mounts"]]
    reasons += ["member of %s" % md for md in drive["md_arrays"]]
    reasons += ["held by %s" % h for h in drive["holders"] if h not in drive["md_arrays"]]
    reasons += ["has partition %s" % p for p in drive["partitions"]]
    reasons += [
        "%s signature on %s" % (s.get("type") or s.get("pttype") or "unknown", s["device"]) for s in drive["signatures"]
    ]
    drive["in_use"] = reasons
    drive["empty"] = not reasons
    return drive


def md_facts(name: str, sysmd: dict, export: dict, mdstat: dict, serial_of: dict, record: dict | None) -> dict:
    """Health of one md array.

    sysmd: level, raid_disks, chunk_size, array_state, size_sectors and members [{name, slot, state,
    present}] read from /sys/block/<md>/md; export: parse_mdadm_export(); mdstat: its parse_mdstat entry;
    serial_of: {kernel name: serial} of the drives present (partitions map to their drive); record: a
    md_record() saved while the array was healthy, the only place a vanished member's serial survives.
    """
    level = sysmd.get("level") or mdstat.get("level") or export.get("level")
    raid_disks = sysmd.get("raid_disks") or export.get("raid_disks") or mdstat.get("raid_disks") or 0
    recorded = {m["role"]: m.get("serial") for m in (record or {}).get("members", [])}
    members, by_role = [], {}
    for m in sorted(sysmd.get("members", []), key=lambda m: (m.get("slot") is None, m.get("slot"), m["name"])):
        flags = mdstat.get("members", {}).get(m["name"], {}).get("flags", [])
        state = m.get("state") or ""
        entry = {
            "name": m["name"],
            "role": m.get("slot"),
            "state": state,
            "present": m.get("present", True),
            "serial": serial_of.get(m["name"]) if m.get("present", True) else recorded.get(m.get("slot")),
            "faulty": "faulty" in state or "F" in flags,
            "spare": m.get("slot") is None or "S" in flags,
        }
        members.append(entry)
        if entry["role"] is not None:
            by_role.setdefault(entry["role"], entry)
    missing = []
    for role in range(raid_disks):
        m = by_role.get(role)
        if m is None or not m["present"] or m["faulty"]:
            missing.append(
                {
                    "role": role,
                    "name": m["name"] if m else None,
                    "serial": (m or {}).get("serial") or recorded.get(role),
                    "reason": "faulty" if m and m["present"] else "gone",
                }
            )
    array_state = sysmd.get("array_state")
    tolerance = raid_disks - 1 if level == "raid1" else TOLERANCE.get(level)
    if array_state in ("inactive", "clear") or (not mdstat.get("active", True) and array_state is None):
        health = "inactive"
    elif array_state == "broken" or (missing and tolerance is not None and len(missing) > tolerance):
        health = "broken"
    elif missing or sysmd.get("degraded"):
        health = "degraded"
    else:
        health = "healthy"
    serials = [
        by_role[r]["serial"] if r in by_role and by_role[r]["present"] else recorded.get(r) for r in range(raid_disks)
    ]
    facts = {
        "name": name,
        "device": "/dev/" + name,
        "level": level,
        "raid_disks": raid_disks,
        "chunk_bytes": sysmd.get("chunk_size"),
        "size_bytes": sysmd.get("size_sectors", 0) * SECTOR,
        "array_state": array_state,
        "health": health,
        "broken": health == "broken",
        "degraded": health == "degraded",
        "uuid": export.get("uuid"),
        "md_name": export.get("md_name"),
        "metadata": export.get("metadata"),
        "members": members,
        "member_serials": serials,
        "missing": missing,
        "missing_serials": [m["serial"] for m in missing if m["serial"]],
        "record_found": record is not None,
    }
    facts["record"] = md_record(facts) if health == "healthy" else None
    return facts


def md_record(array: dict) -> dict | None:
    """What to save (as JSON in RECORD_DIR) right after creating an array, so that a member which later
    disappears can still be named by serial. None unless every role has a known serial."""
    serials = array.get("member_serials") or []
    if not serials or None in serials or not array.get("uuid"):
        return None
    return {
        "uuid": array["uuid"],
        "device": array["device"],
        "level": array["level"],
        "chunk_bytes": array.get("chunk_bytes"),
        "members": [{"role": i, "serial": s} for i, s in enumerate(serials)],
    }


# -- system layer -----------------------------------------------------------------------------------


def _run(argv):
    env = dict(os.environ, LC_ALL="C")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    except FileNotFoundError:
        return 127, "", "%s: command not found" % argv[0]
    return proc.returncode, proc.stdout, proc.stderr


def _read(path, default=None):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return default


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def read_block_graph(sys_block: str) -> dict:
    """{name: {size_sectors, partitions, holders, parent, md}} for every block device and partition."""
    graph = {}

    def node(name, path, parent):
        graph[name] = {
            "size_sectors": _int(_read(os.path.join(path, "size"))) or 0,
            "holders": sorted(os.listdir(os.path.join(path, "holders")))
            if os.path.isdir(os.path.join(path, "holders"))
            else [],
            "partitions": [],
            "parent": parent,
            "md": os.path.isdir(os.path.join(path, "md")),
        }

    for name in sorted(os.listdir(sys_block)) if os.path.isdir(sys_block) else []:
        path = os.path.join(sys_block, name)
        node(name, path, None)
        for sub in sorted(os.listdir(path)):
            if sub.startswith(name) and os.path.exists(os.path.join(path, sub, "partition")):
                node(sub, os.path.join(path, sub), name)
                graph[name]["partitions"].append(sub)
    return graph


def read_md_sysfs(md_dir: str, graph: dict) -> dict:
    """/sys/block/<md>/md: level, raid_disks, chunk, array_state and the members (dev-*)."""
    members = []
    for entry in sorted(glob.glob(os.path.join(md_dir, "dev-*"))):
        name = os.path.basename(entry)[4:]
        slot = _read(os.path.join(entry, "slot"))
        members.append(
            {
                "name": name,
                "slot": _int(slot),  # "none" for spares
                "state": _read(os.path.join(entry, "state"), ""),
                # A removed drive keeps its dev-* entry (md still holds it) but its block device is gone.
                "present": name in graph,
            }
        )
    return {
        "level": _read(os.path.join(md_dir, "level")),
        "raid_disks": _int(_read(os.path.join(md_dir, "raid_disks"))),
        "chunk_size": _int(_read(os.path.join(md_dir, "chunk_size"))),
        "array_state": _read(os.path.join(md_dir, "array_state")),
        "degraded": _int(_read(os.path.join(md_dir, "degraded"))),
        "size_sectors": _int(_read(os.path.join(os.path.dirname(md_dir), "size"))) or 0,
        "members": members,
    }


def read_records(record_dir: str) -> dict:
    """{md uuid: record} from the JSON files md_record() produced."""
    out = {}
    for path in sorted(glob.glob(os.path.join(record_dir, "*.json"))):
        try:
            with open(path) as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("uuid"):
            out[rec["uuid"]] = rec
    return out


def _dev_name(root: str, source: str, graph: dict):
    """Kernel name behind a mount source such as /dev/md0 or /dev/mapper/vg-lv (-> dm-0)."""
    if not source.startswith("/dev/"):
        return None
    real = os.path.basename(os.path.realpath(os.path.join(root, source.lstrip("/"))))
    return real if real in graph else os.path.basename(source)


def collect(run=None, root: str = "/", expected_serials=(), record_dir: str = RECORD_DIR, id_ns: bool = True) -> dict:
    """Read the system and return {drives, md_arrays, missing_serials, unexpected_serials, root_device}."""
    run = run or _run
    sys_block = os.path.join(root, "sys/block")
    rc, out, err = run(["nvme", "list", "-o", "json"])
    if rc == 127:
        raise ProbeError("nvme-cli is not installed on this host: install the nvme-cli package")
    if rc != 0:
        raise ProbeError("`nvme list -o json` failed (rc %d): %s" % (rc, err.strip()))
    graph = read_block_graph(sys_block)
    namespaces = [ns for ns in parse_nvme_list(out) if ns["name"] in graph]

    mounts = parse_mounts(_read(os.path.join(root, "proc/mounts"), ""))
    for m in mounts:
        m["dev"] = _dev_name(root, m["source"], graph)
    root_dev = next((m["dev"] for m in reversed(mounts) if m["target"] == "/"), None)
    if root_dev not in graph and root == "/":
        st = os.stat("/")  # e.g. source /dev/root: ask the kernel which device "/" lives on
        link = "/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
        root_dev = os.path.basename(os.path.realpath(link)) if os.path.exists(link) else root_dev

    by_id_dir = os.path.join(root, "dev/disk/by-id")
    links = {}
    for link in sorted(os.listdir(by_id_dir)) if os.path.isdir(by_id_dir) else []:
        links[link] = os.path.basename(os.readlink(os.path.join(by_id_dir, link)))

    drives, serial_of = [], {}
    for ns in namespaces:
        name = ns["name"]
        queue = {a: _int(_read(os.path.join(sys_block, name, "queue", a))) for a in QUEUE_ATTRS}
        if id_ns:
            rc, out, err = run(["nvme", "id-ns", "-o", "json", ns["device"]])
            ns.update(parse_id_ns(out) if rc == 0 else {"lba_formats": [], "lba_format_in_use": None})
        signatures = {}
        for dev in [name] + graph[name]["partitions"]:
            rc, out, err = run(["blkid", "-p", "-o", "export", "/dev/" + dev])
            if rc == 0:
                signatures[dev] = parse_blkid_export(out)
            elif rc == 127:
                raise ProbeError("blkid is not installed on this host: install the util-linux package")
            elif rc == 8:  # several signatures at once: certainly not empty
                signatures[dev] = {"type": "ambivalent", "detail": err.strip()}
            elif rc not in (2,):  # 2: nothing found
                signatures[dev] = {"type": "unknown", "detail": "blkid rc %d: %s" % (rc, err.strip())}
        drives.append(drive_facts(ns, graph, queue, signatures, mounts, root_dev, links))
        for dev in [name] + graph[name]["partitions"]:
            serial_of[dev] = ns["serial"]

    mdstat = parse_mdstat(_read(os.path.join(root, "proc/mdstat"), ""))
    records = read_records(os.path.join(root, record_dir.lstrip("/")))
    arrays = {}
    for name in sorted(n for n, node in graph.items() if node["md"]):
        rc, out, err = run(["mdadm", "--detail", "--export", "/dev/" + name])
        export = parse_mdadm_export(out) if rc == 0 else {}
        sysmd = read_md_sysfs(os.path.join(sys_block, name, "md"), graph)
        arrays[name] = md_facts(name, sysmd, export, mdstat.get(name, {}), serial_of, records.get(export.get("uuid")))
        arrays[name]["mounts"] = [{"target": m["target"], "fstype": m["fstype"]} for m in mounts if m["dev"] == name]

    present = {d["serial"] for d in drives}
    return {
        "drives": sorted(drives, key=lambda d: (d["serial"] or "", d["name"])),
        "md_arrays": arrays,
        "root_device": root_dev,
        "missing_serials": [s for s in expected_serials if s not in present],
        "unexpected_serials": sorted(present - set(expected_serials)) if expected_serials else [],
    }
