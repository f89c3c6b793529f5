"""The L3 evictor on real files: under the high watermark nothing goes; above it the least recently used chunks go
until the low one; chunks being written or just written are never touched."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = time.time()
MIB = 2**20


def _module():
    path = ROOT / "roles" / "l3_evictor" / "files" / "kvtier_l3_evictor.py"
    spec = importlib.util.spec_from_file_location("kvtier_l3_evictor", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


evictor = _module()


def chunk(root: pathlib.Path, name: str, used_ago: float, written_ago: float | None = None, size: int = MIB):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\1" * size)  # written bytes take blocks: the evictor counts what is on disk
    written = NOW - (used_ago if written_ago is None else written_ago)
    os.utime(path, (NOW - used_ago, written))
    return path


def on_disk(path: pathlib.Path) -> int:
    return path.stat().st_blocks * 512


@pytest.fixture
def pool(tmp_path):
    """Ten 1 MiB chunks in two model directories, used 10..100 minutes ago (chunk0 least recently)."""
    paths = [chunk(tmp_path, f"model{i % 2}/chunk{i}", used_ago=(10 - i) * 600) for i in range(10)]
    return tmp_path, paths


def test_under_the_high_watermark_nothing_is_removed(pool):
    root, paths = pool
    budget = sum(on_disk(p) for p in paths) / 0.9 + 1  # the pool just under 90 % of its budget
    run = evictor.evict(str(root), int(budget), high=0.9, low=0.5, min_age=60, now=NOW)
    assert run.removed == 0 and run.chunks == 10 and all(p.exists() for p in paths)


def test_above_it_the_least_recently_used_go_down_to_the_low_watermark(pool):
    root, paths = pool
    size = on_disk(paths[0])
    run = evictor.evict(str(root), budget=10 * size, high=0.9, low=0.55, min_age=60, now=NOW)
    # 10 chunks in a budget of 10: over 90 %, so down to 5.5 chunks' worth: the 5 least recently used go.
    assert run.removed == 5 and run.removed_bytes == 5 * size
    assert [p.exists() for p in paths] == [False] * 5 + [True] * 5
    assert run.used_before == 10 * size and run.used_after == 5 * size


def test_a_read_counts_as_a_use(pool):
    root, paths = pool
    size = on_disk(paths[0])
    os.utime(paths[0], (NOW - 1, NOW - 6000))  # chunk0 was written first but read a second ago
    evictor.evict(str(root), budget=10 * size, high=0.9, low=0.85, min_age=60, now=NOW)
    assert paths[0].exists() and not paths[1].exists() and not paths[2].exists()


def test_chunks_being_written_or_just_written_are_spared(tmp_path):
    old = [chunk(tmp_path, f"m/chunk{i}", used_ago=3600) for i in range(3)]
    fresh = chunk(tmp_path, "m/fresh", used_ago=3600, written_ago=5)  # atime older than its write: an old copy
    writing = [
        chunk(tmp_path, ".tmp-spark01/m/chunk9", used_ago=7200),  # LMCache's per-node temp directory
        chunk(tmp_path, "m/chunk8.tmp", used_ago=7200),
    ]
    size = on_disk(old[0])
    run = evictor.evict(str(tmp_path), budget=2 * size, high=0.9, low=0.1, min_age=60, now=NOW)
    assert run.chunks == 4  # the temp files are not even counted
    assert not any(p.exists() for p in old)
    assert fresh.exists() and all(p.exists() for p in writing)


def test_a_chunk_removed_by_someone_else_is_counted_not_fatal(pool, monkeypatch):
    root, paths = pool
    real_unlink = os.unlink

    def racing_unlink(path):
        if path == str(paths[0]):
            real_unlink(path)
            raise FileNotFoundError(path)
        real_unlink(path)

    monkeypatch.setattr(evictor.os, "unlink", racing_unlink)
    run = evictor.evict(str(root), budget=10 * on_disk(paths[0]), high=0.9, low=0.55, min_age=60, now=NOW)
    assert run.vanished == 1 and run.removed == 4


def test_the_command_reports_and_writes_its_metrics(pool, tmp_path_factory, capsys):
    root, paths = pool
    metrics = tmp_path_factory.mktemp("textfile") / "kvtier-l3.prom"
    budget = 10 * on_disk(paths[0])
    assert evictor.main([str(root), "--budget-bytes", str(budget), "--low", "0.5", "--textfile", str(metrics)]) == 0
    said = capsys.readouterr().out
    assert "10 chunks" in said and "removed 5 " in said
    text = metrics.read_text()
    assert f"kvtier_l3_budget_bytes {budget}" in text and "kvtier_l3_evicted_chunks 5" in text
    if shutil.which("promtool"):
        proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_counters_carry_from_run_to_run(pool, tmp_path_factory):
    root, paths = pool
    metrics = tmp_path_factory.mktemp("textfile") / "kvtier-l3.prom"
    size = on_disk(paths[0])
    args = [str(root), "--budget-bytes", str(10 * size), "--low", "0.5", "--min-age", "0", "--textfile", str(metrics)]
    assert evictor.main(args) == 0  # ten chunks: five go
    chunk(root, "new/a", used_ago=1)
    chunk(root, "new/b", used_ago=1)
    assert evictor.main(args) == 0  # seven chunks: under the high watermark, none go
    for name in ("c", "d", "e"):
        chunk(root, f"new/{name}", used_ago=1)
    assert evictor.main(args) == 0  # ten again: five go
    totals = evictor.previous_totals(str(metrics))
    assert totals == {
        "kvtier_l3_evictor_runs_total": 3,
        "kvtier_l3_evicted_chunks_total": 10,
        "kvtier_l3_evicted_bytes_total": 10 * size,
    }
    assert "kvtier_l3_evicted_chunks 5\n" in metrics.read_text()  # the last run's own figure stays a gauge


def test_bad_input_is_refused_before_anything_is_removed(pool, capsys):
    root, paths = pool
    with pytest.raises(SystemExit):
        evictor.main([str(root), "--budget-bytes", "1", "--high", "0.5", "--low", "0.7"])
    with pytest.raises(SystemExit):  # one budget, not two
        evictor.main([str(root), "--budget-bytes", "1", "--budget-fraction", "0.5"])
    assert evictor.main([str(root / "absent"), "--budget-bytes", "1"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert all(p.exists() for p in paths)


def test_a_budget_can_be_a_share_of_the_file_system(pool, capsys):
    root, paths = pool
    assert evictor.main([str(root), "--budget-fraction", "1"]) == 0
    assert "removed 0 " in capsys.readouterr().out  # ten MiB in a whole file system: nothing to do
    assert all(p.exists() for p in paths)
