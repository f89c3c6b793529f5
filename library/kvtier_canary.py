#!/usr/bin/python
"""Ansible module: one step of a canary (a salted request whose cache entries are its own) on a Spark."""

DOCUMENTATION = r"""
module: kvtier_canary
short_description: Plant, serve or remove a canary request on a Spark, to prove a tier without disturbing it
description:
  - A canary is a short prompt sent with its own cache salt (vLLM's C(cache_salt)), which LMCache writes into every
    object key, so no client's request can hit its entries and they can be removed one by one through LMCache's API.
    Removing them from the tiers LMCache looks in first shows the tier below (kvtier_canary in playbooks/tasks/
    p2p_canary.yml proves a P2P transfer between two Sparks this way). The same probe code backs
    C(kvtier health --canary).
  - C(action=plant) sends the canary and waits until each persistent adapter stored it; its object keys are read
    from the L3 directory. C(action=serve) sends it again and reports what LMCache's counters say served it.
    C(action=forget) removes its keys from this server's DRAM (C(tier=l1)) or from the named L2 adapters (shared).
  - Check mode sends nothing and removes nothing.
options:
  action: {description: The step., type: str, required: true, choices: [plant, serve, forget]}
  vllm_url: {description: "The node's vLLM base URL (plant, serve).", type: str}
  lmcache_http:
    description: "LMCache's HTTP API on the node (its /metrics and /cache/objects)."
    type: str
    required: true
  model: {description: "The served model name (plant, serve).", type: str}
  salt:
    description: "The canary's cache salt: unique per canary, 1-128 characters, no @ / or backslash."
    type: str
    required: true
  chunk_size: {description: "LMCache's chunk size in tokens (plant).", type: int}
  prompt: {description: "The prompt plant returned (serve).", type: str}
  persistent_adapters:
    description: "LMCache adapter names of the persistent tiers, e.g. [resp, fs] (plant waits for them)."
    type: list
    elements: str
    default: []
  l3_path: {description: "The L3 directory, where the canary's keys are read (plant).", type: path}
  keys: {description: "The keys plant returned (forget).", type: list, elements: dict, default: []}
  tier:
    description: "forget - l1 (this server's DRAM) or l2 (persistent_adapters)."
    type: str
    choices: [l1, l2]
    default: l1
  store_timeout: {description: Seconds to wait for the stores (plant)., type: float, default: 60}
"""

EXAMPLES = r"""
- name: Plant a canary on spark02
  kvtier_canary:
    action: plant
    vllm_url: http://127.0.0.1:8000
    lmcache_http: http://127.0.0.1:6999
    model: qwen3-8b
    salt: kvtier-canary-restart-20261205
    chunk_size: 256
    persistent_adapters: [resp, fs]
    l3_path: /mnt/kvtier/lmcache
  delegate_to: spark02
  register: planted
"""

RETURN = r"""
canary:
  description: >-
    plant - prompt, cold (status, cached_tokens, prompt_tokens, seconds, error), late (adapters that stored nothing),
    keys, wanted (full chunks). serve - reply, l1_hit_tokens (served from LMCache's DRAM), loads (completed loads per
    adapter). forget - deleted.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_lmcache import ProbeError, canary_prompt, forget, plant, serve

REQUIRED = {"plant": ["vllm_url", "model", "chunk_size"], "serve": ["vllm_url", "model", "prompt"], "forget": []}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=["plant", "serve", "forget"]),
            vllm_url=dict(type="str"),
            lmcache_http=dict(type="str", required=True),
            model=dict(type="str"),
            salt=dict(type="str", required=True),
            chunk_size=dict(type="int"),
            prompt=dict(type="str"),
            persistent_adapters=dict(type="list", elements="str", default=[]),
            l3_path=dict(type="path"),
            keys=dict(type="list", elements="dict", default=[], no_log=False),
            tier=dict(type="str", choices=["l1", "l2"], default="l1"),
            store_timeout=dict(type="float", default=60),
        ),
        supports_check_mode=True,
    )
    p = module.params
    missing = [name for name in REQUIRED[p["action"]] if p[name] is None]
    if missing:
        module.fail_json(msg="action=%s needs %s" % (p["action"], ", ".join(missing)))
    if set(p["salt"]) & set("@/\\\x00") or not 0 < len(p["salt"]) <= 128:
        module.fail_json(msg="LMCache refuses the salt %r: 1-128 characters, none of @ / \\ or NUL" % p["salt"])
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: no canary is sent or removed", canary={})
    endpoints = {"vllm": p["vllm_url"], "lmcache_metrics": p["lmcache_http"].rstrip("/") + "/metrics"}
    try:
        if p["action"] == "plant":
            prompt = canary_prompt(p["salt"], p["chunk_size"])
            result = plant(
                endpoints,
                p["model"],
                prompt,
                p["salt"],
                p["chunk_size"],
                p["persistent_adapters"],
                p["l3_path"],
                p["store_timeout"],
            )
            module.exit_json(changed=True, canary=dict(result, prompt=prompt))
        if p["action"] == "serve":
            module.exit_json(changed=False, canary=serve(endpoints, p["model"], p["prompt"], p["salt"]))
        deleted = 0
        for adapter in p["persistent_adapters"] if p["tier"] == "l2" else [None]:
            deleted += forget(p["lmcache_http"], p["keys"], p["tier"], adapter).get("deleted", 0)
        module.exit_json(changed=deleted > 0, canary={"deleted": deleted})
    except (ProbeError, OSError, ValueError, KeyError) as err:
        module.fail_json(msg="canary %s (%s) on %s failed: %s" % (p["action"], p["salt"], p["lmcache_http"], err))


if __name__ == "__main__":
    main()
