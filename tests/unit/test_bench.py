"""The bench's figures and files: TTFT summaries, the storage analysis, and the plots a person reads."""

from __future__ import annotations

import csv
import json

import pytest

from kvtier.bench import files, storage, ttft
from kvtier.cluster import load_order, load_spec
from tests.unit._cluster_data import spec_dict


def _point(sweep, tier, context, value, rate=None, cached=0, **extra):
    point = {
        "sweep": sweep,
        "tier": tier,
        "context": context,
        "ttft": value,
        "seconds": value,
        "prompt_tokens": context,
    }
    point.update(cached_tokens=cached, **({"rate": rate} if rate is not None else {}), **extra)
    return point


POINTS = [
    _point("context", "cold", 1024, 0.40),
    _point("context", "cold", 1024, 0.60),
    _point("context", "l0", 1024, 0.10, cached=992),
    _point("context", "l0", 1024, 0.12, cached=992),
    _point("hit_rate", "cold", 1024, 0.50, rate=0),
    _point("hit_rate", "l0", 1024, 0.30, rate=50, cached=480),
    _point("tiers", "cold", 1024, 0.50),
    _point("tiers", "l2", 1024, 0.20, cached=992, counter_moved=1),
    _point("tiers", "l3", 1024, 0.25, cached=992, counter_moved=0),
]


def test_summary_gives_median_p95_and_the_ratio_to_cold_of_its_own_sweep():
    rows = {(r["sweep"], r["tier"], r["rate"]): r for r in ttft.summarize(POINTS)}
    assert rows[("context", "cold", None)]["ttft_p50"] == 0.5
    assert rows[("context", "l0", None)]["ttft_p50"] == 0.11
    assert rows[("context", "l0", None)]["ttft_p95"] == pytest.approx(0.119)
    assert rows[("context", "l0", None)]["vs_cold"] == 0.22
    assert rows[("tiers", "l2", None)]["vs_cold"] == 0.4  # against the tiers sweep's own cold request
    assert rows[("tiers", "l3", None)]["counter_moved"] == 0  # shown, so a hit that no counter saw stands out
    assert rows[("hit_rate", "l0", 50)]["vs_cold"] is None
    order = [(r["sweep"], r["tier"]) for r in ttft.summarize(POINTS)]
    assert order[:2] == [("context", "cold"), ("context", "l0")] and order[-1] == ("tiers", "l3")


def test_a_tiers_sweep_gives_the_measured_load_order_the_spec_takes():
    results = [{"host": "spark01", "summary": ttft.summarize(POINTS)}]
    measured = ttft.measured_load_order(results)
    assert measured == {"l2": 0.2, "l3": 0.25}
    spec = load_spec(spec_dict(load_order={"measured_s": measured}))
    assert load_order.decide(spec).tiers == ("l2", "l3")
    assert ttft.measured_load_order([{"host": "spark01", "summary": ttft.summarize(POINTS[:6])}]) is None


def test_plots_draw_the_tiers_sweep_against_context_and_the_hit_rate_sweep():
    result = {"host": "spark01", "summary": ttft.summarize(POINTS)}
    by_context, by_rate = ttft.plots([result])
    assert set(by_context["series"]) == {"cold (no cache)", "L2 remote memory", "L3 NVMe pool"}
    assert by_rate["series"] == {"1024 tokens": [(0, 0.5, 0.5), (50, 0.3, 0.3)]}
    without_tiers = {"host": "spark01", "summary": ttft.summarize([p for p in POINTS if p["sweep"] != "tiers"])}
    assert set(ttft.plots([without_tiers])[0]["series"]) == {"cold (no cache)", "L0 local DRAM"}


def test_files_are_written_and_readable(tmp_path):
    rows = [dict(host="spark01", **r) for r in ttft.summarize(POINTS)]
    result = {"host": "spark01", "summary": ttft.summarize(POINTS)}
    files.write_json(tmp_path / "ttft.json", {"results": [result]})
    files.write_csv(tmp_path / "ttft.csv", rows)
    png, page = files.write_plots(tmp_path, "ttft", ttft.plots([result]), "kvtier bench ttft", rows, ["measured on X"])
    assert json.loads((tmp_path / "ttft.json").read_text())["results"][0]["host"] == "spark01"
    with (tmp_path / "ttft.csv").open() as fh:
        read = list(csv.DictReader(fh))
    assert len(read) == len(rows) and read[0]["ttft_p50"] == "0.5"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "<?xml" not in text
    assert text.count("<tr>") == len(rows) + 1 and "measured on X" in text


def _fio(write_bw, read_bw, error=0):
    return {
        "jobs": [
            {"jobname": "seq-write", "error": error, "write": {"bw_bytes": write_bw}, "read": {"bw_bytes": 0}},
            {
                "jobname": "rand-read",
                "error": 0,
                "read": {"bw_bytes": read_bw, "iops": read_bw / 2**21, "clat_ns": {"percentile": {"99.000000": 4e6}}},
            },
        ]
    }


def _record(host, role, write_mib, read_mib, speed=100000):
    return {
        "host": host,
        "role": role,
        "path": "/srv/kvcache",
        "size": "16G",
        "link": {"interface": "ens1f0np0", "speed_mbps": speed},
        "fio": _fio(write_mib * 2**20, read_mib * 2**20),
    }


def test_storage_analysis_sets_each_spark_against_the_array_and_the_line_rate():
    records = [_record("spark01", "spark", 5000, 8000), _record("storage01", "storage", 20000, 40000)]
    analysis = storage.analyse(records)
    array, spark = analysis["rows"]
    assert array["host"] == "storage01" and "read_vs_array" not in array
    assert spark["write_vs_array"] == 0.25 and spark["read_vs_array"] == 0.2
    assert storage.line_rate_mib_s(100000) == 11920.9
    assert spark["read_vs_line_rate"] == round(8000 / 11920.9, 3)
    assert spark["read_lat_p99_ms"] == 4.0
    lines = storage.table(analysis)
    assert lines[1].startswith("storage01") and "0.25w 0.20r" in lines[2]


def test_storage_analysis_without_a_known_speed_or_array_says_so():
    analysis = storage.analyse([_record("spark01", "spark", 100, 100, speed=-1)])
    row = analysis["rows"][0]
    assert row["read_vs_line_rate"] is None and row["read_vs_array"] is None
    assert storage.line_rate_mib_s(None) is None


def test_a_fio_error_is_reported():
    record = _record("spark01", "spark", 1, 1)
    record["fio"]["jobs"][0]["error"] = 5
    assert storage.throughput(record)["errors"] == ["seq-write: error 5"]


def test_a_local_l3_directory_is_not_set_against_the_link():
    record = dict(_record("spark01", "spark", 100, 100), transport="local")
    row = storage.analyse([record, _record("storage01", "storage", 200, 200)])["rows"][1]
    assert row["transport"] == "local" and row["read_vs_line_rate"] is None and row["read_vs_array"] == 0.5
