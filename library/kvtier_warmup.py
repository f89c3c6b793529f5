#!/usr/bin/python
"""Ansible module: fill a Spark's cache tiers from a prompt corpus, and show that it hits."""

DOCUMENTATION = r"""
module: kvtier_warmup
short_description: Replay a prompt corpus against a Spark's vLLM until its chunks sit in the persistent tiers
description:
  - Sends every prompt of the corpus to the node's own vLLM (streamed, at most O(concurrency) at a time), waits
    until LMCache's counters show the new chunks stored by each persistent adapter (kvtier's L2 and L3), then
    replays the corpus and reports the hit tokens. The same code backs C(kvtier warmup).
  - C(changed) means new cache entries were stored; a corpus that is already cached in full leaves it false.
  - Check mode sends nothing: it tokenizes the corpus (read-only) and reports what it would send.
options:
  vllm_url: {description: The node's vLLM base URL., type: str, required: true}
  lmcache_metrics_url: {description: LMCache's metrics URL on the node., type: str, required: true}
  model: {description: The served model name., type: str, required: true}
  chunk_size: {description: LMCache's chunk size in tokens (a cache serves whole chunks)., type: int, required: true}
  max_model_len: {description: The longest prompt vLLM accepts (longer entries are refused first)., type: int}
  corpus:
    description:
      - Entries C({prompt: text}) or C({tokens: N, id: name}) (a document of exactly N tokens, made from O(text_file)).
    type: list
    elements: dict
    default: []
  lengths: {description: Shorthand for corpus entries of these token lengths., type: list, elements: int, default: []}
  name:
    description: Tag at the start of every generated document (its chunks are the corpus's own).
    type: str
    default: kvtier warmup
  text_file:
    description: Local text the documents are made from.
    type: path
    default: /usr/share/common-licenses/GPL-3
  persistent_adapters:
    description: "LMCache adapter names of the persistent tiers, e.g. [resp, fs]."
    type: list
    elements: str
    default: []
  concurrency: {description: Requests in flight at once., type: int, default: 4}
  store_timeout: {description: Seconds to wait for the stores to reach the persistent tiers., type: float, default: 120}
  replay:
    description: Send the corpus again and count its hit tokens (a replay that hits nothing fails).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Warm this Spark with eight 1024-token documents
  kvtier_warmup:
    vllm_url: "{{ vllm_lmcache_node.endpoints.vllm }}"
    lmcache_metrics_url: "{{ vllm_lmcache_node.endpoints.lmcache_metrics }}"
    model: "{{ vllm_lmcache_node.served_name }}"
    chunk_size: 256
    lengths: [1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024]
    persistent_adapters: [resp, fs]
"""

RETURN = r"""
warmup:
  description: >-
    prompts, prompt_tokens, cacheable_tokens, already_cached_tokens, new_prompts, chunks_stored, tokens_stored, failed,
    ttft (p50/p95 seconds), stored (L0 chunks and bytes, and stores and bytes per persistent adapter), stores_late
    (adapters that stored nothing new), stores_pending (what LMCache had not finished storing),
    replay (hit_tokens, cacheable_tokens, failed, ttft).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kvtier_lmcache import ProbeError, get_metrics, lmcache_summary, node_api_key
from ansible.module_utils.kvtier_warmup import (
    corpus_problems,
    corpus_prompts,
    length_entries,
    problems,
    tokenize,
    warm,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vllm_url=dict(type="str", required=True),
            lmcache_metrics_url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            chunk_size=dict(type="int", required=True),
            max_model_len=dict(type="int"),
            corpus=dict(type="list", elements="dict", default=[]),
            lengths=dict(type="list", elements="int", default=[]),
            name=dict(type="str", default="kvtier warmup"),
            text_file=dict(type="path", default="/usr/share/common-licenses/GPL-3"),
            persistent_adapters=dict(type="list", elements="str", default=[]),
            concurrency=dict(type="int", default=4),
            store_timeout=dict(type="float", default=120),
            replay=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    corpus = list(p["corpus"]) + length_entries(p["lengths"])
    unusable = corpus_problems(corpus, p["max_model_len"])
    if unusable:
        module.fail_json(msg="the warmup corpus is not usable: " + "; ".join(unusable))
    try:
        prompts = corpus_prompts(p["vllm_url"], p["model"], corpus, p["text_file"], p["name"])
        if module.check_mode:
            tokens = [len(x) if isinstance(x, list) else len(tokenize(p["vllm_url"], p["model"], x)) for x in prompts]
            module.exit_json(
                changed=True,
                msg="would send %d prompt(s), %d tokens; whether they are cached shows only by sending them"
                % (len(prompts), sum(tokens)),
                warmup={"prompts": len(prompts), "prompt_tokens": sum(tokens)},
            )
        result = warm(
            p["vllm_url"],
            p["model"],
            prompts,
            lambda: lmcache_summary(get_metrics(p["lmcache_metrics_url"])),
            p["persistent_adapters"],
            p["chunk_size"],
            p["concurrency"],
            p["store_timeout"],
            p["replay"],
            node_api_key(),
        )
    except (ProbeError, OSError, ValueError, KeyError) as err:
        module.fail_json(msg="warmup against %s failed: %s" % (p["vllm_url"], err))
    found = problems(result, p["store_timeout"])
    if found:
        module.fail_json(msg="warmup of %s: %s" % (p["vllm_url"], "; ".join(found)), warmup=result)
    module.exit_json(changed=result["changed"], warmup=result)


if __name__ == "__main__":
    main()
