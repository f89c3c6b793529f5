"""The CLI reads an inventory as ansible-playbook does, and the proof's view of a cluster follows from it."""

import pathlib

import pytest

from kvtier.inventory import Inventory, InventoryError
from kvtier.nodes.target import TargetError, from_inventory

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "inventories"


def test_group_members_and_templated_host_variables():
    inventory = Inventory(FIXTURES / "good")
    assert inventory.group("spark") == ["spark01", "spark02", "spark03", "spark04"]
    assert inventory.group("nosuchgroup") == []
    # kv_store_admin_password is "{{ vault_kv_store_admin_password }}" in group_vars: templated like a play would.
    values = inventory.hostvars("kv-storage01", "kv_store_admin_password", "kvtier_data_address", "not_set")
    assert values == {"kv_store_admin_password": "test-admin-password-0123456789", "kvtier_data_address": "10.10.0.10"}


def test_a_missing_inventory_or_host_is_a_clear_error():
    with pytest.raises(InventoryError, match="does not exist"):
        Inventory(FIXTURES / "no-such-inventory")
    with pytest.raises(InventoryError, match="host spark09 is not in the inventory"):
        Inventory(FIXTURES / "good").hostvars("spark09")


def test_the_proof_target_of_a_real_inventory():
    t = from_inventory(Inventory(FIXTURES / "good"))
    assert list(t.nodes) == ["spark01", "spark02", "spark03", "spark04"]
    assert t.nodes["spark01"].argv("true") == ["true"]  # ansible_connection: local: run here
    assert (t.l2_name, t.l3_name, t.spec.l2.host) == ("resp", "fs", "10.10.0.10")
    assert t.l2_admin_password == "test-admin-password-0123456789"


def test_an_inventory_without_sparks_is_refused():
    with pytest.raises(TargetError, match="no hosts in the group 'spark'"):
        from_inventory(Inventory(FIXTURES / "groups_empty"))


def test_health_checks_every_host_of_the_example_against_one_mtu():
    t = from_inventory(Inventory(pathlib.Path(__file__).resolve().parents[2] / "inventory" / "example"))
    assert t.fabric["kv-storage01"] == {"interfaces": ["enp65s0f0np0"], "mtu": 9000, "io_size": 1048576}
    # Both netdevs of the Spark's port.
    assert t.fabric["spark03"]["interfaces"] == ["enp1s0f0np0", "enP2p1s0f0np0"]
    assert t.spec.node("spark03").ucx_traffic_class == 106


def test_health_reads_the_l3_evictor_where_the_playbook_puts_it():
    """The storage node by default, the host kvtier_l3_evictor_node names otherwise (the lab: spark01)."""
    t = from_inventory(Inventory(pathlib.Path(__file__).resolve().parents[2] / "inventory" / "example"))
    assert t.l3_evictor.name == "kv-storage01"
    assert t.l3_evictor_textfile == "/var/lib/prometheus/node-exporter/kvtier-l3.prom"
