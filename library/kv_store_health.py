#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: prove that a Valkey/Redis endpoint answers, authenticates and runs as configured."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kv_store_health
short_description: Probe a Valkey or Redis server the way its clients see it
description:
  - Connects to one endpoint, optionally checks that unauthenticated commands are refused,
    authenticates, reads C(INFO), compares C(CONFIG GET) values with expectations and runs a
    SET/GET/DEL round trip on a throw-away key.
  - Read-only from Ansible's point of view (never reports a change). The round trip is skipped in
    check mode.
  - Needs only the Python standard library on the target.
options:
  host:
    description: Address to connect to.
    type: str
    default: 127.0.0.1
  port:
    description: TCP port (the kv_store role passes kv_store_port, the one definition of it).
    type: int
    required: true
  username:
    description: ACL user to authenticate as. Leave empty for password-only C(AUTH).
    type: str
  password:
    description: Password of I(username). Without it no C(AUTH) is sent.
    type: str
  expect_auth_required:
    description: Fail unless an unauthenticated C(PING) is refused with C(NOAUTH).
    type: bool
    default: false
  expect_config:
    description:
      - Map of configuration parameter to expected value, compared with C(CONFIG GET).
        The user needs the C(config) permission.
    type: dict
    default: {}
  roundtrip:
    description: SET, GET and DEL a probe key to prove the user can store and load.
    type: bool
    default: false
  timeout:
    description: Socket timeout in seconds.
    type: float
    default: 5.0
author:
  - kvtier developers
"""

EXAMPLES = r"""
- name: Prove the LMCache user can store and load
  kv_store_health:
    host: 10.10.0.10
    port: "{{ kv_store_port }}"
    username: "{{ kv_store_lmcache_user }}"
    password: "{{ kv_store_lmcache_password }}"
    expect_auth_required: true
    roundtrip: true
  no_log: true
"""

RETURN = r"""
flavor:
  description: C(valkey) or C(redis).
  returned: success
  type: str
version:
  description: Server version.
  returned: success
  type: str
memory:
  description: used_memory, maxmemory, maxmemory_policy and evicted_keys from INFO.
  returned: success
  type: dict
keys:
  description: Keys the server holds (every database, from INFO keyspace).
  returned: success
  type: int
persistence:
  description: aof_enabled and rdb_changes_since_last_save from INFO.
  returned: success
  type: dict
config:
  description: The values read for the keys of I(expect_config).
  returned: when expect_config is set
  type: dict
roundtrip:
  description: C(ok), or C(skipped (check mode)).
  returned: when roundtrip is true
  type: str
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_resp import RespClient, RespError, server_identity


def _endpoint(params):
    return "%s:%s" % (params["host"], params["port"])


def check_auth_required(params):
    """Return None if an unauthenticated PING is refused, else a message."""
    with RespClient(params["host"], params["port"], params["timeout"]) as client:
        try:
            client.call("PING")
        except RespError as err:
            if str(err).startswith("NOAUTH"):
                return None
            return "unauthenticated PING on %s failed with %r, expected NOAUTH" % (_endpoint(params), str(err))
    return "unauthenticated PING on %s succeeded: the server accepts clients without a password" % _endpoint(params)


def probe(params, check_mode):
    """Run the checks; return (result, list of failure messages)."""
    result = {}
    failures = []
    if params["expect_auth_required"]:
        msg = check_auth_required(params)
        if msg:
            failures.append(msg)
    with RespClient(params["host"], params["port"], params["timeout"]) as client:
        if params.get("password"):
            try:
                client.auth(params.get("username"), params["password"])
            except RespError as err:
                failures.append(
                    "authentication as %r on %s failed: %s"
                    % (params.get("username") or "default", _endpoint(params), err)
                )
                return result, failures
        info = client.info("server", "memory", "persistence", "stats", "keyspace")
        result["flavor"], result["version"] = server_identity(info)
        result["memory"] = {
            "used_memory": int(info.get("used_memory", 0)),
            "maxmemory": int(info.get("maxmemory", 0)),
            "maxmemory_policy": info.get("maxmemory_policy", ""),
            "evicted_keys": int(info.get("evicted_keys", 0)),
        }
        # INFO keyspace: "db0:keys=12,expires=0,avg_ttl=0" per database that holds keys.
        result["keys"] = sum(
            int(dict(part.split("=", 1) for part in value.split(",") if "=" in part).get("keys", 0))
            for name, value in info.items()
            if name.startswith("db") and name[2:].isdigit()
        )
        result["persistence"] = {
            "aof_enabled": info.get("aof_enabled") == "1",
            "rdb_changes_since_last_save": int(info.get("rdb_changes_since_last_save", 0)),
        }
        if params["expect_config"]:
            result["config"] = {}
            for key, want in sorted(params["expect_config"].items()):
                got = client.config_get(key).get(key)
                result["config"][key] = got
                if got is None:
                    failures.append("config %s is unknown to %s %s" % (key, result["flavor"], result["version"]))
                elif str(got) != str(want):
                    failures.append("config %s is %r on %s, expected %r" % (key, got, _endpoint(params), str(want)))
        if params["roundtrip"]:
            if check_mode:
                result["roundtrip"] = "skipped (check mode)"
            else:
                key = "kvtier:probe:%s:%d" % (socket.gethostname(), os.getpid())
                value = os.urandom(16).hex()
                try:
                    client.call("SET", key, value)
                    got = client.call("GET", key)
                    client.call("DEL", key)
                except RespError as err:
                    failures.append("SET/GET/DEL round trip on %s failed: %s" % (_endpoint(params), err))
                else:
                    if got != value.encode():
                        failures.append("round trip on %s read back %r, wrote %r" % (_endpoint(params), got, value))
                    else:
                        result["roundtrip"] = "ok"
    return result, failures


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            username=dict(type="str"),
            password=dict(type="str", no_log=True),
            expect_auth_required=dict(type="bool", default=False),
            expect_config=dict(type="dict", default={}),
            roundtrip=dict(type="bool", default=False),
            timeout=dict(type="float", default=5.0),
        ),
        supports_check_mode=True,
    )
    try:
        result, failures = probe(module.params, module.check_mode)
    except (OSError, ConnectionError) as err:
        module.fail_json(
            msg="cannot reach %s: %s (is the service running and bound to this address?)"
            % (_endpoint(module.params), err)
        )
    if failures:
        module.fail_json(msg="; ".join(failures), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
