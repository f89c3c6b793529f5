"""The P2P leave (roles/vllm_lmcache/files/kvtier_p2p_leave.py): the server's heartbeats are refused before it is
deregistered, so no heartbeat can register it again while its peers drop it and while it shuts down."""

import importlib.util
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_HELPER = ROOT / "roles" / "vllm_lmcache" / "files" / "kvtier_p2p_leave.py"
_spec = importlib.util.spec_from_file_location("kvtier_p2p_leave", _HELPER)
leave_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(leave_module)


class Coordinator:
    """LMCache 0.5.6's registrar against its coordinator: a heartbeat that gets a 404 registers again, unless this
    node's connections to the coordinator are refused."""

    def __init__(self):
        self.registered, self.blocked, self.calls = True, False, []

    def request(self, method, url):
        self.calls.append((method, url))
        if method == "DELETE":
            self.registered = False
        return b""

    def heartbeat(self):
        if not self.blocked:
            self.registered = True  # the 404, then a registration at the next tick

    def nft(self, script):
        self.calls.append(("nft", script))
        self.blocked = True


def test_the_heartbeats_are_refused_before_the_server_is_deregistered(monkeypatch):
    coordinator = Coordinator()
    monkeypatch.setattr(leave_module, "_request", coordinator.request)
    monkeypatch.setattr(leave_module, "registered", lambda base, instance: coordinator.registered)
    said = leave_module.leave("http://10.10.0.21:9300", "spark02", coordinator.nft)
    assert said == "spark02 deregistered at http://10.10.0.21:9300, its heartbeats refused until it starts again"
    assert [c[0] for c in coordinator.calls] == ["nft", "DELETE"]
    for _ in range(5):  # heartbeats while its peers poll and while it shuts down
        coordinator.heartbeat()
    assert not coordinator.registered


def test_a_registration_that_comes_back_is_an_error(monkeypatch):
    monkeypatch.setattr(leave_module, "_request", lambda method, url: b"")
    monkeypatch.setattr(leave_module, "registered", lambda base, instance: True)
    with pytest.raises(
        RuntimeError, match="registered at http://10.0.0.1:9300 again although its heartbeats are refused"
    ):
        leave_module.leave("http://10.0.0.1:9300", "spark02", lambda script: None)


def test_the_block_refuses_every_user_but_root_the_coordinator_only():
    rules = leave_module.block_rules("http://10.10.0.21:9300")
    assert "ip daddr 10.10.0.21 tcp dport 9300 meta skuid != 0 reject with tcp reset" in rules
    assert "ip6 daddr fd00::21 tcp dport 9300" in leave_module.block_rules("http://[fd00::21]:9300")
    assert rules.startswith("table inet kvtier_leave\ndelete table inet kvtier_leave\n")


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed (bootstrap installs it)")
def test_nft_accepts_the_block(tmp_path):
    path = tmp_path / "leave.nft"
    path.write_text(leave_module.block_rules("http://10.10.0.21:9300"))
    checked = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


METRICS = """# HELP lmcache_mp_l2_store_submitted_requests_total x
lmcache_mp_l2_store_submitted_requests_total 12.0
lmcache_mp_l2_store_completed_requests_total{l2_name="fs"} 5.0
lmcache_mp_l2_store_completed_requests_total{l2_name="resp"} %s
"""


def test_the_server_leaves_once_its_stores_are_done():
    reads = iter([METRICS % 5.0, METRICS % 7.0, METRICS % 7.0])
    clock = iter(range(100))
    said = leave_module.settle("http://m", clock=lambda: next(clock), sleep=lambda s: None, read=lambda: next(reads))
    assert said == "its stores done"
    assert leave_module.stores_in_flight(METRICS % 5.0) == 2


def test_stores_that_never_finish_do_not_hold_the_restart_for_ever():
    clock = iter(range(0, 1000, 10))
    said = leave_module.settle("http://m", clock=lambda: next(clock), sleep=lambda s: None, read=lambda: METRICS % 1.0)
    assert said == "6 store task(s) still in flight after 60 s"
