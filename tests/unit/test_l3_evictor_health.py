"""Health of the L3 evictor, read from the textfile the real evictor writes (roles/l3_evictor's script on real
files): the pool's fill against its watermarks, an evictor that stopped, one that never ran, one that cannot keep
up."""

import os
import time

from kvtier.probes import health as h

from .test_l3_evictor import MIB, chunk, evictor


def _run(tmp_path, chunks: int, budget_mib: int, min_age: int = 0):
    root, textfile = tmp_path / "pool", tmp_path / "textfile" / "kvtier-l3.prom"
    textfile.parent.mkdir(exist_ok=True)
    for i in range(chunks):
        chunk(root, f"c/{i:03d}", used_ago=600 - i)
    args = [str(root), "--budget-bytes", str(budget_mib * MIB), "--min-age", str(min_age), "--textfile", str(textfile)]
    assert evictor.main(args) == 0
    return textfile


def test_a_pool_under_its_watermarks_is_ok(tmp_path):
    textfile = _run(tmp_path, chunks=12, budget_mib=10)  # over the high watermark: the run brings it to the low one
    (found,) = h.evictor_checks("storage01", h.evictor_state(str(textfile)))
    assert (found["status"], found["code"], found["check"], found["tier"]) == (h.OK, "L3_EVICTOR_OK", "evictor", "l3")
    assert "of its 10.0 MiB budget" in found["reason"] and "5 chunks removed in all" in found["reason"]


def test_a_pool_the_evictor_cannot_bring_down_is_named(tmp_path):
    textfile = _run(tmp_path, chunks=12, budget_mib=10, min_age=3600)  # every chunk too young to remove
    (found,) = h.evictor_checks("storage01", h.evictor_state(str(textfile)))
    assert (found["status"], found["code"]) == (h.WARN, "L3_OVER_BUDGET")
    assert "l3_evictor_interval" in found["fix"]


def test_an_evictor_that_stopped_is_named(tmp_path):
    textfile = _run(tmp_path, chunks=2, budget_mib=10)
    long_ago = time.time() - 3600
    text = textfile.read_text().replace(
        next(line for line in textfile.read_text().splitlines() if line.startswith("kvtier_l3_evictor_last_run")),
        f"kvtier_l3_evictor_last_run_timestamp_seconds {long_ago}",
    )
    textfile.write_text(text)
    (found,) = h.evictor_checks("storage01", h.evictor_state(str(textfile)))
    assert (found["status"], found["code"]) == (h.WARN, "L3_EVICTOR_STALE")
    assert "last ran 60 min ago" in found["reason"]


def test_an_evictor_that_never_ran_is_named(tmp_path):
    state = h.evictor_state(str(tmp_path / "absent.prom"))
    (found,) = h.evictor_checks("storage01", state)
    assert (found["status"], found["code"]) == (h.WARN, "L3_EVICTOR_MISSING")
    assert "playbooks/l3_evictor.yml" in found["fix"]
    assert not os.path.exists(tmp_path / "absent.prom")
