#!/usr/bin/python
"""Ansible module: every kvtier health check of one host, read-only (also in check mode)."""

DOCUMENTATION = r"""
module: kvtier_health
short_description: Check a Spark's or the storage node's tiers and name every problem with its code and fix
description:
  - Read-only; changes nothing, so check mode runs every check too.
  - On a Spark (O(endpoints) given) checks the LMCache server and vLLM, P2P registration and peers, the LMCache
    adapter of each lower tier and whether its stores complete, the L2 server as LMCache's user sees it, the L3
    directory and the NFS mount's transport, and the running services' cache-key settings against the spec.
  - On the storage node (O(array_name) given) checks the md array by member serial and its XFS mount's free space.
  - On either, with O(data_interfaces), each RoCE netdev up at O(mtu) with an ACTIVE RDMA link on it.
  - Each check is host, tier, status (OK, WARN, ERR, UNVERIFIED with the reason it could not run), a stable code,
    a reason and a fix. The same code backs C(kvtier health), which adds checks across nodes.
options:
  name: {description: Host name to put in the results (the inventory name)., type: str, required: true}
  endpoints: {description: "URLs of vllm, lmcache_http and lmcache_metrics (kvtier renders them).", type: dict}
  model: {description: Served model name vLLM must list., type: str}
  p2p_peers: {description: Peers LMCache P2P must see (omit without P2P)., type: int}
  adapters: {description: "LMCache adapter of each lower tier, e.g. {l2: resp, l3: fs}.", type: dict, default: {}}
  load_order:
    description: "The lower tiers fastest first and their load times, e.g. {fastest_first: [l3, l2], seconds:
      {l3: 0.004, l2: 0.028}, basis: estimated}: a running LMCache that looks in a slower tier first is a warning."
    type: dict
    default: {}
  units: {description: "systemd units of the services: {lmcache: ..., vllm: ...}.", type: dict, default: {}}
  expected_settings: {description: Key settings the spec renders (see kvtier.probes.health.key_settings)., type: dict}
  fingerprint: {description: The cluster fingerprint the units must carry., type: str}
  l2_host: {description: L2 server address as LMCache reaches it., type: str}
  l2_port: {description: L2 server port., type: int}
  l2_user: {description: LMCache's ACL user., type: str}
  l2_password:
    description:
      - Its password. The LMCache server's own login, read from its process, is tried too where it differs (a
        secrets file changed on the node); without this option it is the only one tried.
    type: str
  l2_login_file:
    description: The LMCache server's secrets file, read for its L2 login when the server does not run.
    type: path
  l3_path: {description: LMCache's L3 directory., type: path}
  nfs_mount_point:
    description: The L3 NFS mount, checked when O(rdma_fabric) is true (default, the mount that holds O(l3_path)).
    type: path
  rdma_fabric: {description: Whether the host has an RDMA fabric (an NFS mount for L3)., type: bool, default: true}
  nfs_io_size: {description: The rsize/wsize the L3 mount should have., type: int, default: 1048576}
  data_interfaces:
    description: The host's RoCE netdevs (roce_interface and roce_extra_interfaces).
    type: list
    elements: str
    default: []
  mtu: {description: The fabric's MTU (roce_mtu) every data interface must have., type: int}
  coordinator_url: {description: "The P2P coordinator's URL, on the host that runs it.", type: str}
  coordinator_instances: {description: "What it must list: {instance id: data address} of every Spark.", type: dict}
  array_name: {description: Name of the md array that backs L3 (storage node)., type: str}
  fail_on_error: {description: Fail, listing every ERR, when one check is ERR., type: bool, default: true}
  tolerate:
    description:
      - Codes whose ERR does not fail the task (they are still returned, and listed in RV(tolerated)).
      - For a play that repairs exactly those faults (a restart of LMCache clears C(L2_RESTARTED_UNDER_LMCACHE) and
        C(L2_STORES_FAILING)); any other ERR still fails.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Check this Spark's tiers
  kvtier_health:
    name: "{{ inventory_hostname }}"
    endpoints: "{{ vllm_lmcache_node.endpoints }}"
    model: "{{ vllm_lmcache_node.served_name }}"
    adapters: {l2: resp, l3: fs}
"""

RETURN = r"""
checks:
  description: Every check, each with host, tier, status, code, reason and fix.
  returned: always
  type: list
  elements: dict
counts:
  description: Number of checks per status.
  returned: always
  type: dict
tolerated:
  description: The ERR checks that did not fail the task because their code is in O(tolerate).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_health import (
    ERR,
    STATUSES,
    array_checks,
    array_mount_state,
    config_checks,
    coordinator_checks,
    coordinator_state,
    directory_state,
    fabric_checks,
    fabric_state,
    lmcache_l2_view,
    running_service,
    spark_checks,
)
from ansible.module_utils.kvtier_lmcache import ProbeError as EndpointError
from ansible.module_utils.kvtier_lmcache import probe_node, summary_after
from ansible.module_utils.kvtier_nfs import MOUNTS, mount_facts, mount_point_of, read
from ansible.module_utils.kvtier_nvme import ProbeError, collect
from ansible.module_utils.kvtier_resp import client_view


def spark(p):
    expect = {
        "model": p["model"],
        "adapters": p["adapters"],
        "load_order": p["load_order"],
        "p2p_peers": p["p2p_peers"],
        "l2": bool(p["l2_host"]),
        "l3": bool(p["l3_path"]),
        "rdma_fabric": p["rdma_fabric"],
        "io_size": p["nfs_io_size"],
        "mtu": p["mtu"],
    }
    facts = {"probe": probe_node(p["endpoints"], p["model"], 5.0, p["p2p_peers"])}
    if facts["probe"].get("lmcache") is not None and p["endpoints"].get("lmcache_metrics"):
        # A working adapter catches up within a second (store_gap_checks).
        facts["later"] = summary_after(p["endpoints"]["lmcache_metrics"])
    services = {name: running_service(unit) for name, unit in p["units"].items()}
    facts["lmcache"] = services.get("lmcache")
    if p["l2_host"]:
        if p["l2_password"]:
            facts["l2"] = client_view(p["l2_host"], p["l2_port"], p["l2_user"], p["l2_password"])
        own = lmcache_l2_view(
            (services.get("lmcache") or {}).get("pid"),
            (p["l2_user"], p["l2_password"]),
            lambda user, password: client_view(p["l2_host"], p["l2_port"], user, password),
            p["l2_login_file"],
        )
        if own is not None:
            facts["l2_lmcache"] = own
    if p["l3_path"]:
        # Writable as LMCache's server is (this module runs as root, which may write anywhere).
        facts["l3"] = directory_state(p["l3_path"], (services.get("lmcache") or {}).get("pid"))
        if p["rdma_fabric"]:
            facts["nfs"] = mount_facts(p["nfs_mount_point"] or mount_point_of(p["l3_path"], read(MOUNTS)))
    if p["rdma_fabric"] and p["data_interfaces"]:
        facts["fabric"] = fabric_state(p["data_interfaces"])
    out = spark_checks(p["name"], facts, expect)
    if p["coordinator_url"]:
        out += coordinator_checks(p["name"], coordinator_state(p["coordinator_url"]), p["coordinator_instances"] or {})
    if p["expected_settings"]:
        out += config_checks(p["name"], services, p["expected_settings"], p["fingerprint"])
    return out


def storage(p):
    arrays = collect().get("md_arrays") or {}
    out = array_checks(p["name"], arrays, p["array_name"], array_mount_state(arrays, p["array_name"]))
    if p["data_interfaces"]:
        out += fabric_checks(p["name"], fabric_state(p["data_interfaces"]), p["mtu"])
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            endpoints=dict(type="dict"),
            model=dict(type="str"),
            p2p_peers=dict(type="int"),
            adapters=dict(type="dict", default={}),
            load_order=dict(type="dict", default={}),
            units=dict(type="dict", default={}),
            expected_settings=dict(type="dict"),
            fingerprint=dict(type="str"),
            l2_host=dict(type="str"),
            l2_port=dict(type="int"),
            l2_user=dict(type="str"),
            l2_password=dict(type="str", no_log=True),
            l2_login_file=dict(type="path"),
            l3_path=dict(type="path"),
            nfs_mount_point=dict(type="path"),
            rdma_fabric=dict(type="bool", default=True),
            nfs_io_size=dict(type="int", default=1048576),
            data_interfaces=dict(type="list", elements="str", default=[]),
            mtu=dict(type="int"),
            coordinator_url=dict(type="str"),
            coordinator_instances=dict(type="dict"),
            array_name=dict(type="str"),
            fail_on_error=dict(type="bool", default=True),
            tolerate=dict(type="list", elements="str", default=[]),
        ),
        required_one_of=[["endpoints", "array_name"]],
        required_by={"l2_host": ["l2_port", "l2_user"]},
        supports_check_mode=True,
    )
    p = module.params
    checks = []
    try:
        if p["endpoints"]:
            checks += spark(p)
        if p["array_name"]:
            checks += storage(p)
    except (ProbeError, EndpointError) as err:
        module.fail_json(msg=str(err), checks=checks)
    counts = {status: sum(1 for c in checks if c["status"] == status) for status in STATUSES}
    tolerated = [c for c in checks if c["status"] == ERR and c["code"] in p["tolerate"]]
    errors = [c for c in checks if c["status"] == ERR and c["code"] not in p["tolerate"]]
    if errors and p["fail_on_error"]:
        lines = ["%s %s %s: %s (fix: %s)" % (c["host"], c["tier"], c["code"], c["reason"], c["fix"]) for c in errors]
        module.fail_json(
            msg="%d check(s) ERR: %s" % (len(errors), "; ".join(lines)),
            checks=checks,
            counts=counts,
            tolerated=tolerated,
        )
    module.exit_json(changed=False, checks=checks, counts=counts, tolerated=tolerated)


if __name__ == "__main__":
    main()
