#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: decide whether the NVMe RAID0 can be adopted, created, or must be refused (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvme_raid_plan
short_description: Plan the NVMe RAID0 of the storage node without touching it
description:
  - Reads the drives and md arrays (as M(nvme_facts) does) and compares them with the array spec.
  - Returns C(action) C(adopt) when an array with this name already matches the spec, C(create) when
    the selected drives are provably empty (or may be wiped), and fails with every reason otherwise:
    missing or extra drives, a drive behind the root filesystem, drives that hold data, an existing
    array that differs from the spec or is broken.
  - Read-only; identical in check mode. Standard library only on the target.
options:
  name:
    description: Array name (C(/dev/md/<name>), md_name C(<host>:<name>)).
    type: str
    required: true
  serials:
    description: Exact member serials. When set, the model pattern and count are not used.
    type: list
    elements: str
    default: []
  model_pattern:
    description: Regular expression matched against the drive model when I(serials) is empty.
    type: str
    default: ""
  count:
    description: Number of drives the model pattern must match exactly.
    type: int
    default: 8
  chunk_kib:
    description: RAID0 chunk in KiB.
    type: int
    required: true
  allow_destroy:
    description: Allow wiping selected drives that hold signatures or partitions (never mounted ones).
    type: bool
    default: false
  format_4k:
    description: Plan an C(nvme format) to a 4 KiB LBA format for members not already using one.
    type: bool
    default: false
  record_dir:
    description: Where array records are kept (see M(nvme_facts)).
    type: path
    default: /var/lib/kvtier/md
author:
  - kvtier developers
"""

EXAMPLES = r"""
- name: Plan the array
  nvme_raid_plan:
    name: kvcache
    model_pattern: "^SOLIDIGM "
    count: 8
    chunk_kib: 128
  register: plan
"""

RETURN = r"""
action:
  description: C(adopt), C(create) or C(refuse).
  returned: always
  type: str
device:
  description: The array device (C(/dev/md/<name>) or the adopted array's kernel device).
  returned: always
  type: str
members:
  description: Selected drives (serial, device, by_id), in array order.
  returned: always
  type: list
wipe:
  description: Devices to wipe before creating (only with I(allow_destroy)).
  returned: always
  type: list
format:
  description: Devices to format to 4 KiB and the LBA format index to use.
  returned: always
  type: list
create_argv:
  description: The mdadm command that creates the array (empty unless C(action=create)).
  returned: always
  type: list
problems:
  description: Why the plan was refused.
  returned: always
  type: list
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_nvme import ProbeError, collect
from ansible.module_utils.kvtier_raidplan import plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            serials=dict(type="list", elements="str", default=[]),
            model_pattern=dict(type="str", default=""),
            count=dict(type="int", default=8),
            chunk_kib=dict(type="int", required=True),
            allow_destroy=dict(type="bool", default=False),
            format_4k=dict(type="bool", default=False),
            record_dir=dict(type="path", default="/var/lib/kvtier/md"),
        ),
        required_one_of=[("serials", "model_pattern")],
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        try:
            return module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False)
        except OSError as err:
            return 127, "", str(err)

    try:
        facts = collect(run=run, record_dir=p["record_dir"], id_ns=True)
    except ProbeError as err:
        module.fail_json(msg=str(err))
    result = plan(facts, p)
    if result["problems"]:
        module.fail_json(msg="; ".join(result["problems"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
