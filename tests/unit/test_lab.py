"""The lab's generated inventory is one a real site.yml run accepts, and its report never hides a tier."""

import http.server
import ipaddress
import shutil
import threading

import pytest
import yaml

from kvtier.lab import demo, fabric, lab
from tests.unit.test_preflight_playbook import run_preflight


class FakeVM:
    """Only what the inventory needs of a started VM (no QEMU here)."""

    def instance_config(self):
        return {"instance": lab.STORAGE, "address": "127.0.0.1", "user": "root", "port": 2222,
                "identity_file": "/nonexistent/key"}


def lab_inventory(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "STATE", tmp_path / "state")
    inventory_dir = tmp_path / "lab"
    shutil.copytree(lab.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "hosts.yml").write_text(yaml.safe_dump(lab.inventory(FakeVM())))
    return inventory_dir


def test_lab_inventory_passes_preflight(tmp_path, monkeypatch):
    assert run_preflight(tmp_path, lab_inventory(tmp_path, monkeypatch)) == (0, [])


def test_lab_addresses_are_on_the_lab_network_and_distinct():
    network = ipaddress.ip_network(fabric.SUBNET)
    addresses = [lab.STORAGE_DATA_ADDRESS, *lab.SPARKS.values()]
    assert len(set(addresses)) == len(addresses)
    assert all(ipaddress.ip_address(a) in network for a in addresses)
    assert ipaddress.ip_address(lab.STORAGE_DATA_ADDRESS) != next(network.hosts())  # .1 is the bridge itself


def test_lab_secrets_are_generated_once_and_private(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "STATE", tmp_path)
    first = lab._secrets()
    assert lab._secrets() == first
    assert all(len(v) >= 24 and v != "changeme" for v in first.values())
    assert (tmp_path / "secrets.json").stat().st_mode & 0o077 == 0


def test_demo_reads_the_values_site_yml_used(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "STATE", tmp_path)
    cluster = yaml.safe_load((lab.INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())["kvtier_cluster"]
    config = lab.demo_config()
    assert config.l2_host == cluster["l2"]["host"] == lab.STORAGE_DATA_ADDRESS
    assert (config.vllm_port, config.lmcache_http_port) == (cluster["ports"]["vllm_http"], cluster["ports"]["lmcache_http"])
    assert config.l3_path == cluster["l3"]["path"]
    assert config.admin_password == lab._secrets()["kv_store_admin_password"]


def test_demo_table_flags_a_tier_whose_counter_did_not_move():
    hits = [demo.Hit("L0 local DRAM", "spark01", 1600, "lmcache_mp_lookup_hit_l1_tokens", 1600),
            demo.Hit("L2 resp (storage node)", "spark01", 1600, "l2_name=resp loads", 0),
            demo.Hit("L3 fs after a restart", "spark01", 0, "l2_name=fs loads", 3)]
    lines = demo.table(hits)
    assert [h.proven for h in hits] == [True, False, False]
    assert "NOT PROVEN" not in lines[1]
    assert all("NOT PROVEN" in line for line in lines[2:])


class _DeadEngine(http.server.BaseHTTPRequestHandler):
    """What vLLM's API server answers once its engine has died."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.send_response(500, "Internal Server Error")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_failed_request_says_why_from_the_vllm_journal(monkeypatch):
    server = http.server.HTTPServer(("127.0.0.1", 0), _DeadEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    journal = ("INFO 12-03 07:48:22 [core.py:1] serving\n"
               "ERROR 12-03 07:48:28 [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: -4)\n"
               "ERROR 12-03 07:48:28 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n")
    monkeypatch.setattr(demo.sparks, "exec_", lambda host, *argv, **kw: journal)
    config = demo.Lab(sparks={"spark01": "127.0.0.1"}, model="tiny", venv="/opt/venv", vllm_port=server.server_port,
                      lmcache_http_port=8080, l2_adapter="resp", l2_host="127.0.0.1", l2_port=6379, l3_path="/srv/l3",
                      admin_user="admin", admin_password="x" * 24)
    try:
        with pytest.raises(demo.DemoError) as failure:
            demo.complete(config, "spark01", "a prompt")
    finally:
        server.shutdown()
    message = str(failure.value)
    assert message.startswith("spark01: vLLM answered 500 Internal Server Error: ")
    assert "VllmWorker-0 died unexpectedly (exit code: -4)" in message and "EngineDeadError" in message
    assert "serving" not in message


def test_a_step_whose_engine_died_is_reported_and_run_once_more(monkeypatch):
    ready, attempts, lines = [], [], []
    monkeypatch.setattr(demo, "wait_ready", lambda lab, host, peers: ready.append(host))

    def step(attempt):
        attempts.append(attempt)
        if attempt == 1:
            raise demo.EngineFailed("spark02", "spark02: vLLM answered 500 Internal Server Error: Worker died (exit code: -4)")
        return ["hit"]

    assert demo.once_more(step, lab=None, peers=1, out=lines.append) == ["hit"]
    assert attempts == [1, 2] and ready == ["spark02"]
    assert lines[0] == "  ! spark02: vLLM answered 500 Internal Server Error: Worker died (exit code: -4)"
    assert "runs once more" in lines[1]


def test_an_engine_that_dies_twice_fails_the_demonstration(monkeypatch):
    monkeypatch.setattr(demo, "wait_ready", lambda lab, host, peers: None)

    def step(attempt):
        raise demo.EngineFailed("spark01", f"spark01: died on attempt {attempt}")

    with pytest.raises(demo.EngineFailed, match="died on attempt 2"):
        demo.once_more(step, lab=None, peers=1, out=lambda line: None)


def _p2p_hit(attempt, tokens, delta, why=""):
    return demo.Hit("L1 P2P from spark02", "spark01", tokens, "l2_name=p2p loads", delta, attempt, why)


def test_a_p2p_miss_is_shown_with_what_lmcache_said_and_tried_once_more():
    lines = []
    why = "spark01 sees P2P registered, peers spark02; spark01 LMCache: WARNING: P2P lookup submit timed out"

    def step(attempt):
        return _p2p_hit(1, 0, 0, why) if attempt == 1 else _p2p_hit(2, 1632, 1)

    hit = demo.once_more(step, lab=None, peers=1, out=lines.append, retry_miss=True)
    assert (hit.attempt, hit.cached_tokens, hit.proven) == (2, 1632, True)
    assert lines[0] == ("  ! spark01: L1 P2P from spark02 not proven (0 cached tokens, l2_name=p2p loads moved by 0): "
                        + why)  # fmt: skip
    assert lines[1] == "  ! spark01: once more with a new prompt"
    assert demo.table([hit])[1].endswith("1   (attempt 2)")


def test_a_p2p_miss_twice_stays_not_proven_and_the_table_says_why():
    hits = iter([_p2p_hit(1, 0, 0, "first"), _p2p_hit(2, 0, 0, "spark01 sees P2P registered, peers none")])
    hit = demo.once_more(lambda attempt: next(hits), lab=None, peers=1, out=lambda line: None, retry_miss=True)
    assert not hit.proven
    rows = demo.table([hit])
    assert rows[1].endswith("<- NOT PROVEN")
    assert rows[2] == "  spark01 L1 P2P from spark02: spark01 sees P2P registered, peers none"


def test_a_local_tier_that_is_not_proven_is_not_retried():
    calls = []

    def step(attempt):
        calls.append(attempt)
        return [_p2p_hit(attempt, 0, 0)]

    assert not demo.once_more(step, lab=None, peers=1, out=lambda line: None)[0].proven
    assert calls == [1]


def test_lmcache_warnings_are_read_from_the_journal_without_colours_or_source_locations(monkeypatch):
    journal = (
        "\x1b[32;20m[2026-12-03 10:17:07,304] LMCache INFO:\x1b[0m P2P lookup submitted: task_id=0 "
        "\x1b[3m(p2p_controller.py:309:lmcache.v1.multiprocess.modules.p2p_controller)\x1b[0m\n"
        "\x1b[33;20m[2026-12-03 10:22:26,995] LMCache WARNING:\x1b[0m P2P lookup submit to tcp://10.213.7.22:5555 "
        "timed out; treating as a miss \x1b[3m(p2p_l2_adapter.py:234:lmcache.v1.distributed.l2_adapters.p2p_l2_adapter)\x1b[0m\n"
        "[2026-12-03 10:22:27,001] LMCache ERROR: transfer failed (nixl_impl.py:150:lmcache.v1.distributed)\n"
    )
    calls = []
    monkeypatch.setattr(demo.sparks, "exec_", lambda host, *argv, **kw: calls.append((host, argv)) or journal)
    assert demo.lmcache_warnings("spark01", since=1764757000.4) == [
        "WARNING: P2P lookup submit to tcp://10.213.7.22:5555 timed out; treating as a miss",
        "ERROR: transfer failed",
    ]
    assert calls == [("spark01", ("journalctl", "--unit", "kvtier-lmcache.service", "--since", "@1764757000",
                                  "--output", "cat", "--no-pager"))]  # fmt: skip
    assert demo.lmcache_warnings("spark01", since=0, keep=1) == ["ERROR: transfer failed"]
