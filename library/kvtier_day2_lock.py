#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the cluster's day-2 lock, so that two day-2 runs (an operator's, the health timer's repair) never
restart nodes at the same time."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kvtier_day2_lock
short_description: Take or give back the cluster's day-2 lock
description:
  - The lock is a directory made atomically on one host of the cluster (C(mkdir) either makes it or finds it), with
    a C(holder.json) inside saying who holds it, from where, since when, and the token that gives it back.
  - Every controller that runs a day-2 playbook against the cluster (an operator's machine, the operations host's
    health timer) takes the same lock, because it lives on the cluster, not on a controller.
  - A run that fails keeps the lock: its work stopped halfway (a Spark may be left drained), and nothing else should
    restart nodes until somebody has looked. I(take_over) takes it from a run that is gone.
  - Check mode reports what would happen and writes nothing.
options:
  path:
    description: The lock directory (absolute). It survives a reboot of its host, as an interrupted run must.
    type: path
    default: /var/lib/kvtier/day2.lock
  state:
    description: C(held) takes the lock (fails, naming the holder, if another run holds it); C(released) gives it back.
    type: str
    choices: [held, released]
    default: held
  holder:
    description: Who takes it, for the message another run gets (the playbook, the user and the controller).
    type: str
    default: ""
  token:
    description: With I(state=released), the token I(state=held) returned; a lock held under another token is left.
    type: str
    default: ""
  take_over:
    description: Take the lock although another run holds it (that run must be gone); the old holder is returned.
    type: bool
    default: false
author:
  - kvtier developers
"""

EXAMPLES = r"""
- name: Take the day-2 lock
  kvtier_day2_lock:
    holder: "rolling_restart.yml by ops on ops01"
  register: lock

- name: Give it back
  kvtier_day2_lock:
    state: released
    token: "{{ lock.token }}"
"""

RETURN = r"""
token:
  description: The token that gives the lock back (state=held).
  returned: success
  type: str
holder:
  description: The lock's holder record (holder, token, since); with take_over, the previous holder's.
  returned: when the lock is or was held
  type: dict
"""

import json
import os
import secrets
import shutil
import time

from ansible.module_utils.basic import AnsibleModule

RECORD = "holder.json"


def read_holder(path: str) -> dict:
    """The record of whoever holds the lock at `path` ({} when it is free or its record is unreadable)."""
    try:
        with open(os.path.join(path, RECORD)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def describe(holder: dict) -> str:
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since else "an unknown time"
    return f"{holder.get('holder') or 'a run that left no record'} (since {when})"


def take(path: str, holder: str, take_over: bool) -> tuple:
    """Take the lock: (token, previous holder record or {}). Raises FileExistsError, with the holder, when held."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    previous = {}
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        previous = read_holder(path)
        if not take_over:
            raise FileExistsError(describe(previous)) from None
    token = secrets.token_hex(16)
    record = {"holder": holder, "token": token, "since": time.time()}
    tmp = os.path.join(path, f".{RECORD}.{token}")
    with open(tmp, "w") as handle:
        json.dump(record, handle)
    os.replace(tmp, os.path.join(path, RECORD))
    return token, previous


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/kvtier/day2.lock"},
            "state": {"type": "str", "choices": ["held", "released"], "default": "held"},
            "holder": {"type": "str", "default": ""},
            "token": {"type": "str", "default": ""},
            "take_over": {"type": "bool", "default": False},
        },
        required_if=[("state", "released", ("token",))],
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"path must be absolute: {path}")
    current = read_holder(path) if os.path.isdir(path) else {}
    if p["state"] == "released":
        if not os.path.isdir(path):
            module.exit_json(changed=False, msg="the day-2 lock is free")
        if current.get("token") != p["token"]:
            module.exit_json(changed=False, holder=current, msg=f"the day-2 lock is held by {describe(current)}, left")
        if not module.check_mode:
            shutil.rmtree(path)
        module.exit_json(changed=True, msg="day-2 lock given back")
    if os.path.isdir(path) and not p["take_over"]:
        module.fail_json(
            msg=f"the day-2 lock on this host ({path}) is held by {describe(current)}: another day-2 run is restarting "
            "nodes, or one stopped halfway (its output says where; a Spark it drained is still out of rotation). "
            "Wait for it; if that run is gone, look at the cluster (kvtier health), then run again with "
            "-e kvtier_day2_lock_take_over=true.",
            holder=current,
        )
    if module.check_mode:
        module.exit_json(changed=True, token="", holder=current, msg="would take the day-2 lock")
    try:
        token, previous = take(path, p["holder"], p["take_over"])
    except FileExistsError as exc:  # taken between the look above and mkdir
        module.fail_json(msg=f"the day-2 lock on this host ({path}) was just taken by {exc}")
    except OSError as exc:
        module.fail_json(msg=f"cannot take the day-2 lock at {path}: {exc}")
    said = f"day-2 lock taken from {describe(previous)}" if previous else "day-2 lock taken"
    module.exit_json(changed=True, token=token, holder=previous, msg=said)


if __name__ == "__main__":
    main()
