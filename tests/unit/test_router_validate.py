"""The router role's input checks, run by Ansible on the controller against the good fixture inventory: bad
settings fail with a message that says what to change, before anything on the router host changes."""

import json
import pathlib

import pytest

from ._playbook import results, run_json

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOOD = ROOT / "tests" / "fixtures" / "inventories" / "good"
PLAYBOOK = ROOT / "tests" / "fixtures" / "playbooks" / "router_validate.yml"


def run(tmp_path, **extra):
    """(return code, failure messages, the backends it derived)."""
    args = [PLAYBOOK, "-i", GOOD] + (["-e", json.dumps(extra)] if extra else [])
    rc, report = run_json(tmp_path, *args)
    messages, backends = [], None
    for result in results(report):
        if result.get("failed"):
            messages.append(" ".join(str(result.get("msg", "")).split()))
        if "_router_backends" in result:
            backends = result["_router_backends"]
    return rc, messages, backends


def test_the_good_inventory_puts_the_router_on_the_storage_node_in_front_of_every_spark(tmp_path):
    rc, messages, backends = run(tmp_path)
    assert (rc, messages) == (0, [])
    assert [(b["name"], b["address"], b["port"]) for b in backends] == [
        (f"spark0{n}", f"10.10.0.2{n}", 8000) for n in range(1, 5)
    ]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"router_stats_port": 8000}, "router_port=8000 and router_stats_port=8000 must be two different ports"),
        ({"router_hash_balance_factor": 90}, "router_hash_balance_factor=90 must be 0 (off) or above 100"),
        ({"router_bind_address": "10.99.99.99"}, "router_bind_address=10.99.99.99 is not an address of kv-storage01"),
        ({"kvtier_router_node": "spark01"}, "and not 8000, which this Spark uses"),
        ({"kvtier_router_node": "nosuchhost"}, "kvtier_router_node=nosuchhost is not an inventory host"),
        ({"router_port": "eighty"}, "router_port"),
    ],
)
def test_bad_input_is_refused_with_what_to_change(tmp_path, extra, expected):
    rc, messages, _ = run(tmp_path, **extra)
    assert rc != 0
    assert any(expected in m for m in messages), messages
