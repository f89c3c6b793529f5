"""Which lower tier LMCache loads from: the planner's estimate, a measurement, or an explicit order, and retention."""

import json

import pytest

from kvtier.cluster import SpecError, lmcache_server, load_order, load_spec, render
from tests.unit._cluster_data import PASSWORD, spec_dict


def adapter_types(spec) -> list:
    argv = lmcache_server(spec, "spark01", PASSWORD).argv
    return [json.loads(argv[i + 1])["type"] for i, a in enumerate(argv) if a == "--l2-adapter"]


def test_the_planner_puts_the_nvme_pool_before_remote_memory():
    """Qwen3-8B's 36 MiB chunk: the array over RDMA (11.25 GB/s) beats Valkey/Redis's 1.4 GB/s GET rate."""
    order = load_order.decide(load_spec(spec_dict()))
    assert order.tiers == ("l3", "l2") and order.basis == "estimated"
    assert order.seconds["l3"] < order.seconds["l2"]
    assert adapter_types(load_spec(spec_dict())) == ["fs", "resp"]
    assert list(render.tier_adapters(load_spec(spec_dict()))) == ["l3", "l2", "l1_p2p"]


def test_a_measurement_overrides_the_estimate():
    spec = load_spec(spec_dict(load_order={"measured_s": {"l2": 0.1, "l3": 0.4}}))
    order = load_order.decide(spec)
    assert order.tiers == ("l2", "l3") and order.basis == "measured"
    assert adapter_types(spec) == ["resp", "fs"]


def test_an_explicit_order_wins_and_fastest_first_still_tells_the_truth():
    spec = load_spec(spec_dict(load_order={"tiers": ["l2", "l3"]}))
    order = load_order.decide(spec)
    assert order.tiers == ("l2", "l3") and order.basis == "explicit"
    assert order.fastest_first() == ("l3", "l2")
    assert adapter_types(spec) == ["resp", "fs"]


def test_retention_follows_the_slowdown_against_dram_unless_set():
    estimated = load_order.decide(load_spec(spec_dict()))
    assert estimated.retain and "slower than DRAM" in estimated.retain_basis
    near_dram = load_order.decide(load_spec(spec_dict(load_order={"measured_s": {"l0": 0.1, "l2": 0.15, "l3": 0.12}})))
    assert not near_dram.retain
    argv = lmcache_server(load_spec(spec_dict(load_order={"retain": False})), "spark01", PASSWORD).argv
    assert "--l2-prefetch-policy" not in argv
    only_l0 = load_order.decide(load_spec(spec_dict(tiers=["l0", "l1_p2p"])))
    assert only_l0.tiers == () and not only_l0.retain


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"tiers": ["l3"]}, "load_order.tiers is ['l3']: list each enabled lower tier once (l2, l3), fastest first"),
        ({"tiers": ["l3", "l3"]}, "load_order.tiers is ['l3', 'l3']: list each enabled lower tier once"),
        ({"measured_s": {"l3": 0.1}}, "load_order.measured_s lacks l2: give every enabled lower tier"),
        ({"measured_s": {"l2": -1, "l3": 0.1}}, "load_order.measured_s.l2"),
        ({"measured_s": {"l2": 1, "l3": 1, "l9": 1}}, "load_order.measured_s.l9 is not a known setting"),
        ({"retain": "yes"}, "load_order.retain must be true or false"),
        ({"order": ["l3", "l2"]}, "load_order.order is not a known setting; known: tiers, measured_s, retain"),
    ],
)
def test_bad_load_order_settings(section, message):
    with pytest.raises(SpecError) as err:
        load_spec(spec_dict(load_order=section))
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems
