"""add_spark.yml and remove_spark.yml refuse a request they cannot carry out before any host is contacted (the
good fixture's hosts do not exist), naming what to fix."""

from .test_day2_guards import run


def test_removing_needs_a_spark_named(tmp_path):
    rc, messages, ran = run(tmp_path, "remove_spark.yml")
    assert rc != 0 and "Check the Spark to remove" in ran
    assert "Name the Spark to remove with -e kvtier_spark=NAME" in messages[0] and "Nothing was changed" in messages[0]


def test_removing_refuses_a_host_that_is_no_spark(tmp_path):
    rc, messages, _ = run(tmp_path, "remove_spark.yml", kvtier_spark="kv-storage01")
    assert rc != 0 and "a host of group spark (spark01, spark02, spark03, spark04)" in messages[0]


def test_removing_refuses_the_coordinators_spark(tmp_path):
    """The fixture's P2P coordinator runs on spark01: taking it away would strand every peer lookup."""
    rc, messages, ran = run(tmp_path, "remove_spark.yml", kvtier_spark="spark01")
    assert rc != 0 and "the P2P coordinator spark01" in messages[0]
    assert "Take the day-2 lock" not in " ".join(ran)


def test_adding_needs_a_spark_of_the_inventory(tmp_path):
    rc, messages, ran = run(tmp_path, "add_spark.yml", kvtier_spark="spark09")
    assert rc != 0 and ran == ["Check the Spark to add"]
    assert "a host listed in the inventory's group spark (spark01, spark02, spark03, spark04)" in messages[0]
