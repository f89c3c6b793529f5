"""The host firewall: who may reach each kvtier port, from the cluster spec, and the nftables table it renders."""

import pathlib
import shutil
import subprocess

import jinja2
import pytest

from kvtier.cluster import firewall, load_spec
from tests.unit._cluster_data import spec_dict

ROOT = pathlib.Path(__file__).resolve().parents[2]
STORAGE = firewall.Storage("kv-storage01", "10.10.0.10")
ROUTER = firewall.Router("kv-storage01", "10.10.0.10", 8000, 8404)
SPARKS = ("10.10.0.21", "10.10.0.22", "10.10.0.23")


def by_port(rules):
    return {(r.proto, r.port): r for r in rules}


def test_a_spark_admits_its_peers_the_router_and_the_operator_only():
    found = firewall.rules(load_spec(spec_dict()), "spark02", STORAGE, ROUTER, admin=("10.10.0.5",), service_uid=990)
    rules = by_port(found.input)
    assert rules[("tcp", 8000)].peers == ("10.10.0.10", "10.10.0.5")
    assert rules[("tcp", 5555)].peers == ("10.10.0.21", "10.10.0.23")  # the other Sparks
    assert rules[("tcp", 8500)].peers == ("10.10.0.21", "10.10.0.23")
    assert rules[("tcp", "20100-20199")].peers == ("10.10.0.21", "10.10.0.23")  # UCX's TCP listeners for NIXL
    assert ("tcp", 9300) not in rules  # the coordinator runs on spark01
    out = by_port(found.output)
    assert out[("tcp", 5555)].peers == SPARKS and out[("tcp", 5555)].owners == (0, 990)
    assert out[("tcp", 6379)].peers == ("10.10.0.10",) and out[("tcp", 6379)].owners == (0, 990)


def test_the_coordinator_host_admits_every_spark():
    found = firewall.rules(load_spec(spec_dict()), "spark01", STORAGE, ROUTER)
    assert by_port(found.input)[("tcp", 9300)].peers == SPARKS
    assert found.output == []  # no service uid given: no owner rules


def test_the_storage_node_admits_the_sparks_to_l2_and_l3_and_the_operator_to_the_statistics():
    found = firewall.rules(load_spec(spec_dict()), "kv-storage01", STORAGE, ROUTER, admin=("10.10.0.5",))
    rules = by_port(found.input)
    for key in (("tcp", 6379), ("tcp", 2049), ("tcp", 111), ("udp", 111), ("udp", 4791)):
        assert rules[key].peers == SPARKS, key
    assert rules[("tcp", 8404)].peers == ("10.10.0.5",)
    assert ("tcp", 8000) not in rules  # clients from anywhere by default: the router's port is not filtered
    limited = firewall.rules(load_spec(spec_dict()), "kv-storage01", STORAGE, ROUTER, clients=("192.168.0.0/16",))
    assert by_port(limited.input)[("tcp", 8000)].peers == ("192.168.0.0/16",)


def test_without_the_tiers_their_ports_are_not_filtered():
    spec = load_spec(spec_dict(tiers=["l0"]))
    assert firewall.rules(spec, "kv-storage01", STORAGE, None).input == []
    # One Spark and no router: vLLM answers the clients themselves.
    assert by_port(firewall.rules(spec, "spark01", STORAGE, None, clients=("10.9.0.0/16",)).input)[
        ("tcp", 8000)
    ].peers == ("10.9.0.0/16",)


def test_ipv6_addresses_go_to_their_own_family():
    data = spec_dict(tiers=["l0", "l1_p2p"])
    data["nodes"] = {"spark01": {"data_address": "fd00::21"}, "spark02": {"data_address": "10.10.0.22"}}
    rule = by_port(firewall.rules(load_spec(data), "spark01", None, None).input)[("tcp", 5555)]
    assert rule.family(4) == ("10.10.0.22",) and rule.family(6) == ()
    rule = by_port(firewall.rules(load_spec(data), "spark02", None, None).input)[("tcp", 5555)]
    assert rule.family(6) == ("fd00::21",)


def _render(found) -> str:
    template = (ROOT / "roles" / "firewall" / "templates" / "kvtier.nft.j2").read_text()

    def as_dict(rule):
        return {**rule.__dict__, "v4": list(rule.family(4)), "v6": list(rule.family(6))}

    rules = {"input": [as_dict(r) for r in found.input], "output": [as_dict(r) for r in found.output]}
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True)
    return env.from_string(template).render(ansible_managed="test", inventory_hostname="spark02", _firewall_rules=rules)


def test_the_rendered_table_rejects_what_it_does_not_admit():
    text = _render(firewall.rules(load_spec(spec_dict()), "spark02", STORAGE, ROUTER, service_uid=990))
    assert "tcp dport 5555 ip saddr { 10.10.0.21, 10.10.0.23 } accept\n\t\ttcp dport 5555 reject with tcp reset" in text
    assert "tcp dport 6379 ip daddr { 10.10.0.10 } meta skuid { 0, 990 } accept" in text
    assert "tcp dport 20100-20199 ip saddr { 10.10.0.21, 10.10.0.23 } accept" in text
    assert text.count("table inet kvtier") == 3  # created if missing, deleted, defined: nothing else is touched


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed (bootstrap installs it)")
@pytest.mark.parametrize("host", ["spark01", "spark02", "kv-storage01"])
def test_nft_accepts_the_rendered_table(tmp_path, host):
    found = firewall.rules(load_spec(spec_dict()), host, STORAGE, ROUTER, admin=("10.10.0.5",), service_uid=990)
    path = tmp_path / "kvtier.nft"
    path.write_text(_render(found))
    checked = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr + path.read_text()
