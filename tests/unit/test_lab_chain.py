"""The lab's chain of stages: named keys, segments that run whole, `--stage` on the lab that is up."""

from __future__ import annotations

import collections
import time

import pytest

from kvtier import exits
from kvtier.lab import lab


def test_every_stage_has_its_own_key_and_a_segment_of_neighbours():
    keys = [step.key for step in lab.CHAIN]
    assert len(keys) == len(set(keys))
    # A segment leaves a state for a later step of it to check or repair: its steps are in chain order.
    segments = collections.defaultdict(list)
    for step in lab.CHAIN:
        segments[step.segment].append(step.key)
    assert segments["grow"] == ["grow"]
    assert segments["drift"] == ["peer-stopped", "drifted", "spec-change", "lookup-timeouts"]
    assert segments["storage"] == ["persist-store", "l2-stopped", "storage-reboot", "l2-repair", "persist-replay"]


def test_a_stage_runs_with_its_whole_segment():
    assert [s.key for s in lab.segment("l2-repair")] == [s.key for s in lab.segment("persist-store")]
    assert [s.key for s in lab.segment("attacker")] == ["attacker"]
    with pytest.raises(lab.UnknownStage, match="no stage 'nope'; the stages: grow, peer-stopped, drifted"):
        lab.segment("nope")


def test_stage_needs_a_lab_that_is_up(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "INVENTORY", tmp_path / "hosts.yml")
    lines = []
    assert lab.test(out=lines.append, stage="attacker") == exits.BAD_INPUT
    assert "no lab is up" in lines[-1]
    assert lab.test(out=lines.append, stage="nope") == exits.BAD_INPUT


def test_stage_runs_its_segment_on_the_kept_lab_and_leaves_it_up(tmp_path, monkeypatch):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    monkeypatch.setattr(lab, "INVENTORY", inventory)
    ran = []
    for name in ("persistence", "l2_stopped", "storage_reboot", "l2_came_back", "attacks", "create", "site"):
        monkeypatch.setattr(lab, name, lambda out, *args, _name=name: ran.append((_name, *args)) or "")
    monkeypatch.setattr(lab, "_down_stage", lambda out: ran.append("down") or "")
    monkeypatch.setattr(lab, "journal_digest", lambda out: None)
    began = time.time()
    assert lab.test(out=lambda _: None, stage="l2-stopped") == exits.OK
    assert ran[:3] + ran[4:] == [
        ("persistence", "store"),
        ("l2_stopped",),
        ("storage_reboot",),
        ("persistence", "replay"),
    ]
    # The L2 fault's stage measures its alert from the moment the reboot stage proved L2 back.
    name, l2_back = ran[3]
    assert name == "l2_came_back" and began <= l2_back <= time.time()
    # A failing step ends the segment: FAILED, and the lab is still left up to look into.
    ran.clear()
    monkeypatch.setattr(lab, "l2_stopped", lambda out: (_ for _ in ()).throw(lab.StageFailed("L2_DOWN on no host")))
    assert lab.test(out=lambda _: None, stage="l2-stopped") == exits.FAILED
    assert ran == [("persistence", "store")]
