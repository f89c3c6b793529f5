#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: readiness and per-tier counters of a Spark serving node (LMCache MP server + vLLM)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lmcache_health
short_description: Wait for and probe an LMCache MP server and vLLM on a serving node
description:
  - Probes the LMCache server's C(/healthcheck) and C(/status), its Prometheus C(/metrics)
    (C(lmcache_mp_*) counters, per L2 adapter by C(l2_name)), vLLM's C(/health), C(/v1/models) and C(/metrics).
  - With I(wait), polls until every given endpoint is healthy (and I(model) is listed), or fails after
    I(wait) seconds with the last problems seen.
  - Read-only (never reports a change); runs in check mode too. Needs only the Python standard library.
options:
  lmcache_http:
    description: Base URL of the LMCache server's HTTP API (C(/healthcheck), C(/status)).
    type: str
  lmcache_metrics:
    description: URL of the LMCache server's Prometheus metrics.
    type: str
  vllm:
    description: Base URL of vLLM's OpenAI server.
    type: str
  model:
    description: Served model name that C(/v1/models) must list.
    type: str
  p2p_peers:
    description:
      - When set, the LMCache server must have P2P enabled, be registered with the coordinator and see
        at least this many peers (C(0) checks the registration only). Needs I(lmcache_http).
    type: int
  wait:
    description: Seconds to keep polling until healthy; C(0) probes once.
    type: int
    default: 0
  interval:
    description: Seconds between polls.
    type: float
    default: 2.0
  timeout:
    description: Timeout of each HTTP request in seconds.
    type: float
    default: 5.0
author:
  - kvtier developers
"""

EXAMPLES = r"""
- name: Wait until vLLM serves the model through LMCache
  lmcache_health:
    lmcache_http: http://127.0.0.1:8080
    lmcache_metrics: http://127.0.0.1:9090/metrics
    vllm: http://127.0.0.1:8000
    model: tiny
    wait: 600
"""

RETURN = r"""
lmcache_healthy:
  description: Whether C(/healthcheck) answered 200.
  returned: when lmcache_http is set
  type: bool
lmcache_status:
  description: LMCache's DRAM (its L1, kvtier's L0) object count and bytes, P2P state and peers, unhealthy parts.
  returned: when the LMCache server is healthy
  type: dict
lmcache:
  description: >-
    Counters: l1_hit_tokens, l2_hit_tokens, finished_stores, finished_retrieves and, per L2 adapter
    (C(resp), C(valkey), C(fs), C(p2p)...), loads, stores and usage_bytes.
  returned: when lmcache_metrics is set
  type: dict
vllm_healthy:
  description: Whether vLLM's C(/health) answered 200.
  returned: when vllm is set
  type: bool
models:
  description: Model ids listed by C(/v1/models).
  returned: when vLLM is healthy
  type: list
vllm:
  description: external_prefix_cache_hits/queries, prompt_tokens, prompt_tokens_by_source, requests_running.
  returned: when vLLM is healthy
  type: dict
waited:
  description: Seconds spent polling.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_lmcache import probe_node


def main():
    module = AnsibleModule(
        argument_spec=dict(
            lmcache_http=dict(type="str"),
            lmcache_metrics=dict(type="str"),
            vllm=dict(type="str"),
            model=dict(type="str"),
            p2p_peers=dict(type="int"),
            wait=dict(type="int", default=0),
            interval=dict(type="float", default=2.0),
            timeout=dict(type="float", default=5.0),
        ),
        required_one_of=[["lmcache_http", "lmcache_metrics", "vllm"]],
        required_by={"model": "vllm", "p2p_peers": "lmcache_http"},
        supports_check_mode=True,
    )
    p = module.params
    endpoints = {k: p[k] for k in ("lmcache_http", "lmcache_metrics", "vllm") if p[k]}
    started = time.monotonic()
    while True:
        result = probe_node(endpoints, p["model"], p["timeout"], p["p2p_peers"])
        waited = round(time.monotonic() - started, 1)
        if not result["problems"] or waited >= p["wait"]:
            break
        time.sleep(p["interval"])
    problems = result.pop("problems")
    if problems:
        suffix = " (after waiting %ss)" % waited if p["wait"] else ""
        module.fail_json(msg="; ".join(problems) + suffix, changed=False, waited=waited, **result)
    module.exit_json(changed=False, waited=waited, **result)


if __name__ == "__main__":
    main()
