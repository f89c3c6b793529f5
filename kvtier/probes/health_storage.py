"""Health of the storage node's array: the md RAID0 by its drives' serials, and the file system on it."""

from __future__ import annotations

try:  # as Ansible ships it (module_utils, for the kvtier_health module)
    from ansible.module_utils.kvtier_health_core import ERR, OK, check
    from ansible.module_utils.kvtier_health_l3 import directory_state, free_checks
except ImportError:  # as kvtier's package has it, and the scripts it ships to nodes (kvtier.nodes.scripts)
    from kvtier.probes.health_core import ERR, OK, check
    from kvtier.probes.health_l3 import directory_state, free_checks


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
        out += free_checks(host, "storage", "XFS", mounts[0].get("target"), mount_state)
    return out
