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
        ({"router_tenants": []}, "router_tenants is empty: give at least one tenant"),
        (
            {"router_tenants": [{"name": "a", "api_key": "changeme"}]},
            "router_tenants[0].api_key (a) still has an example value",
        ),
        (
            {"router_tenants": [{"name": "a b", "api_key": "key-one-0123456789abc"}]},
            "router_tenants[0].name must be letters, digits",
        ),
        (
            {
                "router_tenants": [
                    {"name": "a", "api_key": "key-one-0123456789abc"},
                    {"name": "b", "api_key": "key-one-0123456789abc"},
                ]
            },
            "a and b have the same key",
        ),
        ({"router_cache_salt_secret": "short"}, "router_cache_salt_secret is shorter than 16 characters"),
        ({"router_stats_password": ""}, "router_stats_password is not set"),
        (
            {"router_vllm_api_key": "test-tenant-a-key-0123456789"},
            "router_vllm_api_key is also a tenant's key",
        ),
        ({"router_tls_key_file": "/nonexistent/router.key"}, "router_tls_key_file (/nonexistent/router.key) must name"),
    ],
)
def test_bad_input_is_refused_with_what_to_change(tmp_path, extra, expected):
    rc, messages, _ = run(tmp_path, **extra)
    assert rc != 0
    assert any(expected in m for m in messages), messages
    assert not any("0123456789" in m for m in messages)  # a message names variables, never a value
