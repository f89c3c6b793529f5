"""The warmup's statistics, corpus checks and report (kvtier/probes/warmup.py), and its corpus files."""

from __future__ import annotations

import http.server
import json
import pathlib
import threading
import time

import pytest

from kvtier import warmup
from kvtier.probes import warmup as probe


def test_percentile_interpolates_between_ranks():
    assert probe.percentile([], 50) is None
    assert probe.percentile([3.0], 95) == 3.0
    assert probe.percentile([4, 1, 3, 2], 50) == 2.5
    assert probe.percentile(range(1, 101), 95) == pytest.approx(95.05)
    assert probe.percentile([1, 2, 3], 0) == 1 and probe.percentile([1, 2, 3], 100) == 3


def test_stats_skip_missing_times():
    s = probe.stats([0.2, None, 0.1, 0.4])
    assert s == {"count": 3, "p50": 0.2, "p95": 0.38, "min": 0.1, "max": 0.4}
    assert probe.stats([])["p50"] is None


@pytest.mark.parametrize(
    ("tokens", "chunk", "cacheable"),
    [(1, 32, 0), (32, 32, 31), (33, 32, 32), (64, 32, 63), (65, 32, 64), (1000, 256, 768), (1000, 32, 992)],
)
def test_cacheable_tokens_are_whole_chunks_short_of_the_last_token(tokens, chunk, cacheable):
    assert probe.cacheable_tokens(tokens, chunk) == cacheable


def test_corpus_problems_name_every_bad_entry():
    entries = [{"tokens": 512}, {"prompt": "hello"}, {"tokens": 4}, {"tokens": 4096}, {}, {"prompt": ""}, "x"]
    problems = probe.corpus_problems(entries, max_model_len=2048)
    assert problems == [
        "entry 2: tokens must be a whole number of at least 8, not 4",
        "entry 3: 4096 tokens do not fit max_model_len 2048 (the reply needs a token)",
        "entry 4 needs exactly one of 'prompt' (text) or 'tokens' (a length)",
        "entry 5: prompt must be non-empty text",
        "entry 6 needs exactly one of 'prompt' (text) or 'tokens' (a length)",
    ]
    assert probe.corpus_problems([]) == ["the corpus is empty: give prompts or token lengths"]
    assert probe.corpus_problems([{"tokens": True}])[0].startswith("entry 0: tokens must be a whole number")


def _counters(l1_chunks=0, l1_bytes=0, submitted=None, **adapters):
    """LMCache's counters as lmcache_summary reads them; `submitted` store tasks default to the completed ones."""
    l2 = {name: {"stores": s, "usage_bytes": b, "loads": 0} for name, (s, b) in adapters.items()}
    return {
        "l1_write_chunks": l1_chunks,
        "l1_memory_usage_bytes": l1_bytes,
        "l2_store_requests_submitted": sum(a["stores"] for a in l2.values()) if submitted is None else submitted,
        "l2": l2,
    }


def _reply(prompt_tokens, cached, ttft=0.1, status=200, error=""):
    return {
        "status": status,
        "ttft": ttft,
        "seconds": ttft,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "error": error,
    }


def _wait(readings, expected, timeout=5.0):
    before = _counters(10, resp=(1, 100), fs=(1, 100))
    feed = iter(readings)
    last = {}

    def counters():
        last["seen"] = next(feed, last.get("seen"))
        return last["seen"]

    return probe.wait_stored(counters, before, ["resp", "fs"], expected, timeout, poll=0.01)


def test_wait_stored_waits_for_the_chunks_the_tasks_in_flight_and_a_quiet_moment():
    readings = [
        _counters(14, resp=(2, 100), fs=(1, 100), submitted=3),  # 4 of 8 chunks in DRAM, fs's task in flight
        _counters(18, resp=(2, 300), fs=(2, 300)),  # every chunk in DRAM, every task completed ...
        _counters(18, resp=(2, 300), fs=(2, 300)),  # ... and still so a poll later
    ]
    stored = _wait(readings, expected=8)
    assert stored["late"] == [] and stored["pending"] == []
    assert stored["adapters"] == {"resp": {"stores": 1, "bytes": 200}, "fs": {"stores": 1, "bytes": 200}}
    assert stored["counters"]["l1_write_chunks"] == 18


def test_one_store_task_may_carry_several_prompts_chunks():
    # LMCache batches the keys written to its DRAM: 8 new prompts (64 chunks) stored in 3 tasks per adapter.
    settled = _counters(74, resp=(4, 6500), fs=(4, 6500))
    stored = _wait([settled, settled], expected=64)
    assert stored["late"] == [] and stored["pending"] == []


def test_wait_stored_names_what_was_unfinished_at_the_deadline():
    stuck = _counters(14, resp=(2, 300), fs=(2, 300), submitted=5)
    stored = _wait([stuck], expected=8, timeout=0.05)
    assert stored["late"] == []
    assert stored["pending"] == ["4 of 8 new chunks not yet in LMCache's DRAM", "1 store task(s) still in flight"]
    r = probe.report([_reply(300, 0)], _counters(), stored, 32, 1, None)
    assert probe.problems(r, 120) == [
        "LMCache had not finished storing within 120 s: 4 of 8 new chunks not yet in LMCache's DRAM; 1 store "
        "task(s) still in flight (check with kvtier health)"
    ]


def test_wait_stored_names_an_adapter_that_counts_stores_but_holds_nothing():
    # lmcache 0.5.6 counts a failed store as completed: the bytes show it.
    settled = _counters(18, resp=(2, 100), fs=(2, 900))
    assert _wait([settled], expected=8, timeout=0.05)["late"] == ["resp"]


def test_wait_stored_accepts_a_shared_l3_that_already_had_the_chunks():
    # Measured in the lab: two Sparks warmed the same corpus at once; the second one's fs adapter completed its
    # stores without writing what the first one had written to the shared L3 directory.
    settled = _counters(18, resp=(4, 400), fs=(4, 100))
    assert _wait([settled], expected=8)["late"] == []
    # It must still complete a store.
    assert _wait([_counters(18, resp=(4, 400), fs=(1, 100))], expected=8, timeout=0.05)["late"] == ["fs"]


def test_nothing_new_is_nothing_to_wait_for():
    stored = _wait([_counters(10, resp=(1, 100), fs=(1, 100), submitted=9)], expected=0, timeout=60)
    assert stored["late"] == [] and stored["pending"] == []


def test_report_counts_new_entries_and_replay_hits():
    before = _counters(10, 1000, resp=(5, 500), fs=(5, 500))
    stored = {"counters": _counters(16, 7000), "adapters": {"resp": {"stores": 2, "bytes": 64}}, "late": []}
    first = [_reply(100, 0, 0.3), _reply(100, 96, 0.1), _reply(50, 0, status=500, error="boom")]
    again = [_reply(100, 96, 0.05), _reply(100, 96, 0.07), _reply(50, 32, 0.04)]
    r = probe.report(first, before, stored, 32, 1.5, again)
    assert r["prompts"] == 3 and r["failed"] == 1 and r["errors"] == ["boom"]
    assert r["new_prompts"] == 1 and r["tokens_stored"] == 96 and r["changed"] is True
    assert r["cacheable_tokens"] == 96 + 96 + 32
    assert r["stored"]["l0_chunks"] == 6 and r["stored"]["l0_bytes"] == 6000 and r["stored"]["resp"]["stores"] == 2
    assert r["replay"]["hit_tokens"] == 224 and r["replay"]["ttft"]["p50"] == 0.05


def test_a_warm_corpus_is_not_changed():
    stored = {"counters": _counters(), "adapters": {}, "late": []}
    r = probe.report([_reply(100, 96)], _counters(), stored, 32, 0.1, None)
    assert r["changed"] is False and r["new_prompts"] == 0 and "replay" not in r


def test_corpus_file_and_lengths(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('# a comment\n{"prompt": "hello"}\n\n{"tokens": 512, "id": "doc"}\n')
    assert warmup.load_corpus(str(path)) == [{"prompt": "hello"}, {"tokens": 512, "id": "doc"}]
    path.write_text("{not json\n")
    with pytest.raises(warmup.WarmupError, match="line 1 is not JSON"):
        warmup.load_corpus(str(path))
    entries = probe.length_entries([256, 512], repeat=2)
    assert [e["tokens"] for e in entries] == [256, 512, 256, 512]
    assert len({e["id"] for e in entries}) == 4  # every document its own


def test_warmup_table_reads_as_a_report():
    stored = {"counters": _counters(4, 2**21), "adapters": {"fs": {"stores": 1, "bytes": 2**20}}, "late": []}
    r = probe.report([_reply(100, 0, 0.25)], _counters(), stored, 32, 0.3, [_reply(100, 96, 0.05)])
    lines = warmup.table({"spark01": r})
    assert lines[0].startswith("spark01: 1 prompts, 100 tokens (1 new, 96 tokens stored), 0 failed")
    assert "L0 DRAM 4 chunk(s) 2.0 MiB; fs 1 store(s) 1.0 MiB" in lines[1]
    assert "96 of 96 cacheable tokens hit (100 %)" in lines[2]
    assert lines[3].strip() == "changed: new entries stored"
    json.dumps(r)  # the module returns it as JSON


def test_problems_name_failures_late_stores_and_a_replay_that_hits_nothing():
    stored = {"counters": _counters(), "adapters": {"fs": {"stores": 1, "bytes": 0}}, "late": ["fs"]}
    r = probe.report([_reply(100, 0), _reply(100, 0, status=500, error="engine died")], _counters(), stored, 32, 1, [])
    r["replay"] = {"hit_tokens": 0, "cacheable_tokens": 192, "failed": 0, "ttft": probe.stats([])}
    assert probe.problems(r, 120) == [
        "1 of 2 request(s) failed: engine died",
        "the new chunks did not reach fs within 120 s (LMCache's store counters or bytes did not grow: fs 1 task(s) "
        "+0 bytes; its DRAM took 0 chunk(s) for 3 new): check with kvtier health",
        "the replay hit none of its 192 cacheable tokens: the cache does not serve this corpus "
        "(check with kvtier health)",
    ]
    r.update(failed=0, stores_late=[], replay=dict(r["replay"], hit_tokens=96))
    assert probe.problems(r, 120) == []


class _Recorded(http.server.BaseHTTPRequestHandler):
    """Replays a stream vLLM 0.32.0 sent in the lab (tests/fixtures/vllm), after a pause: the parser under test
    must time the first token, not the connection, and read the usage from the last event."""

    body = (pathlib.Path(__file__).parents[1] / "fixtures" / "vllm" / "completion-stream.txt").read_bytes()
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        _Recorded.seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(0.2)
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_stream_complete_times_the_first_token_and_reads_the_usage():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reply = probe.stream_complete(f"http://127.0.0.1:{server.server_port}", "medium", [1, 2, 3], timeout=10)
    finally:
        server.shutdown()
    assert reply["status"] == 200 and reply["error"] == ""
    assert reply["prompt_tokens"] == 13 and reply["cached_tokens"] == 0
    assert 0.2 <= reply["ttft"] <= reply["seconds"]
    sent = _Recorded.seen[-1]
    assert sent["prompt"] == [1, 2, 3] and sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_stream_complete_reports_a_server_that_is_not_there():
    reply = probe.stream_complete("http://127.0.0.1:9", "m", "x", timeout=2)
    assert reply["status"] == 0 and reply["ttft"] is None and reply["error"]
