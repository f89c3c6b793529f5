#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: facts about the NVMe drives and md arrays of a storage node (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvme_facts
short_description: Gather NVMe drive and md array facts
description:
  - Lists every NVMe namespace with its serial, model, firmware, stable C(/dev/disk/by-id) path, size,
    queue limits, LBA formats, and what it holds (partitions, signatures, md membership, mounts,
    whether it backs the root filesystem). A drive with none of these is reported as C(empty).
  - Reports every md array with its level, chunk, state and members by serial. A member that has
    disappeared (a dead or pulled drive) is reported as missing, by serial when a record of the array
    was saved while it was healthy (see I(record_dir) and the C(record) fact).
  - Read-only; identical in check mode. Needs C(nvme-cli) and C(blkid) on the target and only the
    Python standard library; C(mdadm) is used when present.
options:
  expected_serials:
    description:
      - Serials the host should have. Those not found are returned in C(missing_serials), others
        found in C(unexpected_serials).
    type: list
    elements: str
    default: []
  record_dir:
    description:
      - Directory of JSON records of arrays (the C(record) fact of a healthy array, saved by the role
        that created it). Used to name vanished members by serial.
    type: path
    default: /var/lib/kvtier/md
  lba_formats:
    description: Run C(nvme id-ns) on each namespace to list its LBA formats.
    type: bool
    default: true
author:
  - kvtier developers
"""

EXAMPLES = r"""
- name: Inventory the drives
  nvme_facts:
    expected_serials: "{{ nvme_raid_serials }}"

- name: Refuse to touch a drive that is not empty
  ansible.builtin.assert:
    that: ansible_facts.kvtier_nvme.drives | selectattr('serial', 'in', nvme_raid_serials)
          | rejectattr('empty') | list | length == 0
    fail_msg: "drives in use: {{ ansible_facts.kvtier_nvme.drives | rejectattr('empty') | map(attribute='in_use') }}"

- name: Fail when the array lost a drive
  ansible.builtin.assert:
    that: not ansible_facts.kvtier_nvme.md_arrays.md0.broken
    fail_msg: "md0 is broken, missing {{ ansible_facts.kvtier_nvme.md_arrays.md0.missing_serials }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(kvtier_nvme).
  returned: always
  type: complex
  contains:
    kvtier_nvme:
      description: Drives and arrays.
      type: complex
      contains:
        drives:
          description:
            - One entry per NVMe namespace, sorted by serial, with name, device, by_id, serial, model,
              firmware, nsid, size_bytes, sector_size, logical_block_size, physical_block_size,
              minimum_io_size, optimal_io_size, lba_formats, lba_format_in_use, partitions, signatures,
              md_arrays, holders, mounts, backs_root, in_use (reasons) and empty.
          type: list
          elements: dict
        md_arrays:
          description:
            - By kernel name (C(md0)). level, raid_disks, chunk_bytes, size_bytes, array_state, health
              (healthy, degraded, broken or inactive), broken, degraded, uuid, md_name, members,
              member_serials (by role), missing (role, last kernel name, serial), missing_serials,
              mounts, record_found, and record (to save in I(record_dir); only while healthy).
          type: dict
        root_device:
          description: Kernel name of the device behind C(/).
          type: str
        missing_serials:
          description: Members of I(expected_serials) not found.
          type: list
          elements: str
        unexpected_serials:
          description: Serials found that are not in I(expected_serials) (empty when it is not given).
          type: list
          elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_nvme import ProbeError, collect


def main():
    module = AnsibleModule(
        argument_spec=dict(
            expected_serials=dict(type="list", elements="str", default=[]),
            record_dir=dict(type="path", default="/var/lib/kvtier/md"),
            lba_formats=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )

    def run(argv):
        try:
            return module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False)
        except OSError as err:  # not installed: the probe turns rc 127 into a message saying what to install
            return 127, "", str(err)

    try:
        facts = collect(
            run=run,
            expected_serials=module.params["expected_serials"],
            record_dir=module.params["record_dir"],
            id_ns=module.params["lba_formats"],
        )
    except ProbeError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, ansible_facts={"kvtier_nvme": facts})


if __name__ == "__main__":
    main()
