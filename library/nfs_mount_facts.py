#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: prove that an NFS mount really runs over RDMA (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nfs_mount_facts
short_description: Report the transport of an NFS mount and fail unless it is RDMA
description:
  - Reads C(/proc/mounts) (the options the mount was made with, such as C(proto=rdma)) and
    C(/proc/self/mountstats) (the C(xprt:) line of the RPC transport actually in use, with its counters).
  - Fails with a message that says what to fix when nothing is mounted at I(path), when it is not NFS,
    when the NFS version differs from I(vers), or when the transport is not RDMA, unless I(allow_tcp).
  - Read-only; identical in check mode. Needs only the Python standard library.
options:
  path:
    description: Mount point.
    type: path
    required: true
  allow_tcp:
    description: Accept a mount over TCP (reported, with a warning) instead of failing.
    type: bool
    default: false
  port:
    description: RDMA port the mount must use (the server's C(rdma-port)); not checked when omitted.
    type: int
  vers:
    description: NFS version the mount must have (the C(vers=) option); not checked when omitted.
    type: str
  io_size:
    description: Bytes that rsize and wsize in force must reach (the server may lower them); not checked when omitted.
    type: int
author:
  - kvtier developers
"""

EXAMPLES = r"""
- name: Prove the L3 mount uses RDMA
  nfs_mount_facts:
    path: /mnt/kvcache
    port: 20049
    vers: "4.2"

- name: Show the RDMA counters
  ansible.builtin.debug:
    var: ansible_facts.kvtier_nfs_mount.xprts[0].counters
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(kvtier_nfs_mount).
  returned: always
  type: complex
  contains:
    kvtier_nfs_mount:
      description:
        - path, mounted, nfs, source, fstype, options (from /proc/mounts), proto, port, vers,
          xprt (the first transport's name), xprts (one per transport, each with transport, counters
          by name and raw values) and rdma (true only if proto=rdma and every xprt line is rdma).
      type: dict
problems:
  description: Why the mount is not acceptable (empty when it is).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_nfs import MountError, mount_facts, problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            allow_tcp=dict(type="bool", default=False),
            port=dict(type="int"),
            vers=dict(type="str"),
            io_size=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        facts = mount_facts(params["path"])
    except MountError as err:
        module.fail_json(msg=str(err))
    found = problems(
        facts, allow_tcp=params["allow_tcp"], port=params["port"], vers=params["vers"], io_size=params["io_size"]
    )
    result = dict(changed=False, ansible_facts={"kvtier_nfs_mount": facts}, problems=found)
    if found:
        module.fail_json(msg="; ".join(found), **result)
    if facts["nfs"] and not facts["rdma"]:
        module.warn(
            "%s runs over %s, accepted because allow_tcp is set" % (facts["path"], facts["xprt"] or facts["proto"])
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
