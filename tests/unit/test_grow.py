"""A Spark being removed (the group kvtier_removing that remove_spark.yml makes) leaves every rendering from the
spec and every scrape target, and the lab's inventory edit around the removal puts the file back."""

import pytest
import yaml

from kvtier.cluster import load_spec, render
from kvtier.cluster.inventory import spec_dict_of_play
from kvtier.lab import inventory as lab_inventory
from kvtier.lab.stages import StageFailed
from kvtier.monitoring import targets
from tests.unit._cluster_data import spec_dict


def _play(removing=()):
    """(hostvars, groups) of a play over the fixture's three Sparks, as Ansible hands them to a filter."""
    cluster = spec_dict()
    nodes = cluster.pop("nodes")
    hostvars = {
        host: {"kvtier_cluster": cluster, **{f"kvtier_{k}": v for k, v in node.items()}} for host, node in nodes.items()
    }
    groups = {"spark": list(nodes), "kvtier_removing": list(removing)}
    return hostvars, groups


def test_a_spark_being_removed_leaves_the_spec_and_so_the_router_and_the_peer_count():
    spec = load_spec(spec_dict_of_play(*_play(removing=["spark02"])))
    assert [n.name for n in spec.nodes] == ["spark01", "spark03"]
    assert [b["name"] for b in render.router_backends(spec)] == ["spark01", "spark03"]
    assert render.p2p_peers(spec) == 1
    assert [n.name for n in load_spec(spec_dict_of_play(*_play())).nodes] == ["spark01", "spark02", "spark03"]


def test_a_spark_being_removed_is_no_longer_scraped():
    hostvars, groups = _play(removing=["spark02"])
    view_groups, view = targets.inventory_view(hostvars, groups)
    assert view_groups["spark"] == ["spark01", "spark03"] and "spark02" not in view


def test_the_lab_inventory_without_a_spark_is_put_back(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts.yml"
    text = "# generated\n" + yaml.safe_dump(
        {"all": {"children": {"spark": {"hosts": {"spark01": {"a": 1}, "spark02": {"a": 2}}}}}}
    )
    hosts.write_text(text)
    monkeypatch.setattr(lab_inventory, "INVENTORY", hosts)
    with pytest.raises(RuntimeError), lab_inventory.spark_unlisted("spark02"):
        unlisted = yaml.safe_load(hosts.read_text())
        assert list(unlisted["all"]["children"]["spark"]["hosts"]) == ["spark01"]
        assert hosts.read_text().startswith("# generated\n")
        raise RuntimeError("a failed check inside")
    assert hosts.read_text() == text
    with pytest.raises(StageFailed, match="spark09 is not a Spark"), lab_inventory.spark_unlisted("spark09"):
        pass
