"""Decide what the storage role may do with the NVMe drives: adopt an array, create one, or refuse.

Pure function of the facts `kvtier.probes.nvme.collect()` returns and the array spec, so every rule
(exact member set, root device, empty drives, existing arrays) is unit-tested without hardware.
Standard library only: it runs on the storage node inside the nvme_raid_plan module.
"""

from __future__ import annotations

import re


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _label(drive: dict) -> str:
    return "%s (%s)" % (drive.get("serial"), drive.get("device"))


def select_members(drives: list, spec: dict, problems: list) -> list:
    """The drives the spec names: by serial list, or by model pattern and exact count."""
    if spec.get("serials"):
        wanted = list(spec["serials"])
        dupes = sorted({s for s in wanted if wanted.count(s) > 1})
        if dupes:
            problems.append("nvme_raid_serials lists %s more than once" % ", ".join(dupes))
        by_serial = {d.get("serial"): d for d in drives}
        missing = [s for s in wanted if s not in by_serial]
        if missing:
            problems.append(
                "serial(s) %s not found on this host; it has %s"
                % (", ".join(missing), ", ".join(sorted(str(s) for s in by_serial)) or "no NVMe drives")
            )
        return [by_serial[s] for s in dict.fromkeys(wanted) if s in by_serial]
    pattern = re.compile(spec["model_pattern"])
    matching = [d for d in drives if pattern.search(d.get("model") or "")]
    if len(matching) != spec["count"]:
        problems.append(
            "found %d drive(s) whose model matches %r (%s), expected exactly %d: fix nvme_raid_drive_count "
            "or name the members with nvme_raid_serials"
            % (len(matching), spec["model_pattern"], ", ".join(_label(d) for d in matching) or "none", spec["count"])
        )
    return sorted(matching, key=lambda d: d.get("serial") or "")


def find_array(md_arrays: dict, name: str):
    """The md array created under this name (md_name is "<homehost>:<name>"), if any."""
    for array in md_arrays.values():
        md_name = array.get("md_name") or ""
        if md_name == name or md_name.endswith(":" + name):
            return array
    return None


def compare_array(array: dict, members: list, spec: dict) -> list:
    """How an existing array differs from the spec (empty when it matches)."""
    diffs = []
    if array.get("level") != "raid0":
        diffs.append("level is %s, spec is raid0" % array.get("level"))
    if array.get("raid_disks") != len(members):
        diffs.append("it has %s member(s), spec has %d" % (array.get("raid_disks"), len(members)))
    chunk = spec["chunk_kib"] * 1024
    if array.get("chunk_bytes") != chunk:
        diffs.append("chunk is %s KiB, spec is %d KiB" % ((array.get("chunk_bytes") or 0) // 1024, spec["chunk_kib"]))
    have = set(s for s in array.get("member_serials") or [] if s)
    want = set(d.get("serial") for d in members)
    if have - want:
        diffs.append("member(s) %s are not in the spec" % ", ".join(sorted(have - want)))
    if want - have and array.get("health") == "healthy":
        diffs.append("spec drive(s) %s are not members" % ", ".join(sorted(want - have)))
    return diffs


def check_chunk(members: list, spec: dict, problems: list) -> None:
    chunk = spec["chunk_kib"] * 1024
    if chunk % 4096 or not _is_power_of_two(chunk):
        problems.append("nvme_raid_chunk_kib=%d is not a power of two multiple of 4 KiB" % spec["chunk_kib"])
        return
    for d in members:
        io_min = d.get("minimum_io_size") or 0
        if io_min and chunk % io_min:
            problems.append(
                "nvme_raid_chunk_kib=%d is not a multiple of the minimum I/O size of %s (%d bytes)"
                % (spec["chunk_kib"], _label(d), io_min)
            )


def four_k_format(drive: dict):
    """Index of the LBA format with 4 KiB data and no metadata, or None."""
    for i, f in enumerate(drive.get("lba_formats") or []):
        if f.get("data_size") == 4096 and not f.get("metadata_size"):
            return f.get("index", i)
    return None


def plan(facts: dict, spec: dict) -> dict:
    """Return {action, device, members, wipe, format, create_argv, problems}.

    action: "adopt" (an array with this name matches the spec), "create", or "refuse" (see problems).
    """
    problems: list = []
    drives = facts.get("drives") or []
    members = select_members(drives, spec, problems)
    for d in members:
        if d.get("backs_root"):
            problems.append("drive %s backs the root filesystem; it can never be an array member" % _label(d))
    result = {
        "action": "refuse",
        "device": "/dev/md/" + spec["name"],
        "members": [{"serial": d.get("serial"), "device": d.get("device"), "by_id": d.get("by_id")} for d in members],
        "wipe": [],
        "format": [],
        "create_argv": [],
        "problems": problems,
    }
    array = find_array(facts.get("md_arrays") or {}, spec["name"])
    if array is not None:
        if array.get("health") != "healthy":
            missing = [
                "%s (role %s)" % (m.get("serial") or m.get("name") or "unknown", m.get("role"))
                for m in array.get("missing") or []
            ]
            problems.append(
                "array %s (%s) is %s%s; kvtier will not touch it: replace the drive and recreate the array deliberately"
                % (
                    array.get("device"),
                    spec["name"],
                    array.get("health"),
                    ": missing member(s) " + ", ".join(missing) if missing else "",
                )
            )
        else:
            diffs = compare_array(array, members, spec)
            if diffs:
                problems.append(
                    "array %s (%s) exists but differs from the spec: %s. kvtier never rebuilds an array; if its data "
                    "may go, stop it (mdadm --stop %s) and wipe its members (wipefs -a) yourself, then run again"
                    % (array.get("device"), spec["name"], "; ".join(diffs), array.get("device"))
                )
        if not problems:
            result["action"] = "adopt"
            result["device"] = array.get("device")
        return result

    check_chunk(members, spec, problems)
    for d in members:
        if d.get("empty"):
            continue
        held = [r for r in d.get("in_use") or []]
        hard = d.get("mounts") or d.get("md_arrays") or d.get("holders") or d.get("backs_root")
        if hard:
            problems.append(
                "drive %s is in use (%s); unmount or stop what uses it first" % (_label(d), "; ".join(held))
            )
        elif spec.get("allow_destroy"):
            result["wipe"].append(d.get("device"))
        else:
            problems.append(
                "drive %s is not empty (%s); kvtier creates the array only on empty drives. "
                "Set nvme_raid_allow_destroy: true to wipe it (its data is lost)" % (_label(d), "; ".join(held))
            )
    if spec.get("format_4k"):
        for d in members:
            fmt = four_k_format(d)
            if fmt is None:
                problems.append("drive %s offers no 4 KiB LBA format without metadata" % _label(d))
            elif d.get("lba_format_in_use") != fmt:
                result["format"].append({"device": d.get("device"), "lbaf": fmt})
    if not problems:
        result["action"] = "create"
        result["create_argv"] = [
            "mdadm",
            "--create",
            result["device"],
            "--run",
            "--level=0",
            "--raid-devices=%d" % len(members),
            "--chunk=%dK" % spec["chunk_kib"],
            "--metadata=1.2",
            "--name=%s" % spec["name"],
        ] + [d.get("by_id") or d.get("device") for d in members]
    return result
