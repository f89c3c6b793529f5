"""The P2P leave (roles/vllm_lmcache/files/kvtier_p2p_leave.py) against a simulated coordinator, server and peers:
at the moment the server is frozen, no peer lists it, whatever the phases of its heartbeat and of their polls."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_HELPER = ROOT / "roles" / "vllm_lmcache" / "files" / "kvtier_p2p_leave.py"
_spec = importlib.util.spec_from_file_location("kvtier_p2p_leave", _HELPER)
leave_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(leave_module)


class Cluster:
    """LMCache 0.5.6's registrar (keep_registered) and P2P controller (_poll_cycle), on a simulated clock: the server
    heartbeats every `interval` (a 404 drops its id; it registers again at the next tick); each peer polls the
    coordinator every `interval` and keeps the instances it saw."""

    def __init__(self, interval, heartbeat_phase, peer_phases):
        self.now, self.interval = 0.0, interval
        self.registered, self.assigned, self.frozen_at = True, True, None
        self.next_tick = heartbeat_phase
        self.peers = {phase: True for phase in peer_phases}  # phase -> lists the server
        self.next_poll = dict.fromkeys(peer_phases, 0.0)
        for phase in peer_phases:
            self.next_poll[phase] = phase

    def advance(self, until):
        while True:
            events = [(self.next_tick, "tick", None)] + [(t, "poll", p) for p, t in self.next_poll.items()]
            when, kind, peer = min(events, key=lambda e: e[0])
            if when > until:
                break
            self.now = when
            if kind == "tick":
                self.next_tick += self.interval
                if self.frozen_at is None:
                    if not self.assigned:
                        self.registered = self.assigned = True
                    elif not self.registered:
                        self.assigned = False  # the heartbeat's 404
            else:
                self.next_poll[peer] += self.interval
                self.peers[peer] = self.registered
        self.now = until

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.advance(self.now + seconds)

    def freeze(self):
        self.frozen_at = self.now


@pytest.mark.parametrize("heartbeat_phase", [0.0, 0.02, 0.3, 0.55, 0.97])
@pytest.mark.parametrize("peer_phases", [(0.01, 0.5), (0.04, 0.06), (0.99, 0.33)])
def test_no_peer_lists_the_server_when_it_is_frozen(monkeypatch, heartbeat_phase, peer_phases):
    cluster = Cluster(1.0, heartbeat_phase, peer_phases)
    cluster.advance(3.0)  # running for a while: registered, every peer lists it
    assert all(cluster.peers.values())
    monkeypatch.setattr(leave_module, "registered", lambda base, instance: cluster.registered)
    monkeypatch.setattr(leave_module, "deregister", lambda base, instance: setattr(cluster, "registered", False))
    said = leave_module.leave("http://c", "spark02", cluster.freeze, 1.0, clock=cluster.clock, sleep=cluster.sleep)
    assert cluster.frozen_at is not None and said.endswith("then stopped")
    assert not any(cluster.peers.values()), (cluster.frozen_at, cluster.peers)
    cluster.advance(cluster.now + 10)  # frozen: it never registers again, and no peer adds it back
    assert not cluster.registered and not any(cluster.peers.values())


def test_an_unreachable_coordinator_still_freezes_the_server(monkeypatch):
    frozen = []

    def refused(*args):
        raise OSError("connection refused")

    monkeypatch.setattr(leave_module, "deregister", refused)
    said = leave_module.leave("http://c", "spark02", lambda: frozen.append(True), 1.0, sleep=lambda s: None)
    assert frozen == [True] and said.startswith("the coordinator at http://c did not answer")


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
