"""roles/health_timer through playbooks/health_timer.yml, in check mode on this machine (nothing is written): the
units it would write, checked by `systemd-analyze verify`, and bad input refused with every problem at once.
The command line is the CLI's own (kvtier.health.cli.command), so the unit cannot drift from the parser."""

import argparse
import json
import subprocess

import pytest

from kvtier.health import cli

from ._playbook import check_units, results, run_json

UNITS = ("kvtier-health.service", "kvtier-health.timer")


def run_check(tmp_path, **extravars):
    """(return code, {unit file name: text it would write}, failure messages) of a --check --diff run."""
    # An inventory without hosts: localhost is then the implicit one (local, the playbook's own Python), as for an
    # operator whose inventory lists only the cluster.
    (tmp_path / "empty.yml").write_text("all: {}\n")
    return check_units(
        tmp_path, "playbooks/health_timer.yml", "-i", tmp_path / "empty.yml", "-e", json.dumps(extravars)
    )


@pytest.fixture
def cluster(tmp_path):
    """An inventory file and an executable standing in for kvtier (check mode runs neither)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    kvtier = tmp_path / "bin" / "kvtier"
    kvtier.parent.mkdir()
    kvtier.write_text("#!/bin/sh\nexit 0\n")
    kvtier.chmod(0o755)
    return {"health_timer_inventory": str(inventory), "health_timer_kvtier": str(kvtier)}


def test_the_command_is_one_the_cli_accepts():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    argv = cli.command("/opt/kvtier/bin/kvtier", "/srv/inv/prod", "/var/lib/x/kvtier.prom", True, "/root/.vault")
    args = parser.parse_args(argv[1:])
    assert (args.command, args.inventory, args.prometheus, args.canary) == (
        "health",
        "/srv/inv/prod",
        "/var/lib/x/kvtier.prom",
        True,
    )
    assert args.vault_password_file == "/root/.vault"
    assert "--canary" not in cli.command("/k", "/i", "/t.prom")


def test_check_mode_shows_units_that_systemd_accepts(tmp_path, cluster):
    textfile = tmp_path / "node-exporter" / "kvtier-health.prom"
    rc, written, failed = run_check(tmp_path, **cluster, health_timer_textfile=str(textfile), health_timer_canary=True)
    assert (rc, failed) == (0, [])
    assert sorted(written) == sorted(UNITS)
    service = written["kvtier-health.service"]
    assert f"ExecStart={cluster['health_timer_kvtier']} health -i {cluster['health_timer_inventory']}" in service
    assert f"--prometheus {textfile} --canary" in service
    assert "SuccessExitStatus=1" in service
    assert "OnUnitInactiveSec=5min" in written["kvtier-health.timer"]
    assert not textfile.parent.exists()  # check mode made nothing
    units = tmp_path / "units"
    units.mkdir()
    for name, text in written.items():
        (units / name).write_text(text)
    verify = subprocess.run(
        ["systemd-analyze", "verify", *(str(units / name) for name in UNITS)], capture_output=True, text=True
    )
    # A directive systemd cannot parse is only a warning ("ignoring"): none may name these units.
    assert verify.returncode == 0 and "kvtier-health" not in verify.stderr, verify.stderr


def test_repair_is_off_unless_asked_and_then_has_time_for_a_rolling_restart(tmp_path, cluster):
    _, written, _ = run_check(tmp_path, **cluster)
    assert "--repair" not in written["kvtier-health.service"]
    assert "TimeoutStartSec=5min" in written["kvtier-health.service"]
    rc, written, failed = run_check(tmp_path, **cluster, health_timer_repair=True)
    assert (rc, failed) == (0, [])
    assert written["kvtier-health.service"].split("ExecStart=")[1].splitlines()[0].endswith(" --repair")
    assert "TimeoutStartSec=2h" in written["kvtier-health.service"]
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    assert parser.parse_args(cli.command("/k", "/i", "/t.prom", repair=True)[1:]).repair


def test_bad_input_is_refused_with_every_problem_at_once(tmp_path, cluster):
    rc, written, failed = run_check(
        tmp_path,
        health_timer_inventory="inventory/prod",
        health_timer_kvtier=str(tmp_path / "nowhere" / "kvtier"),
        health_timer_textfile="/var/lib/prometheus/node-exporter/kvtier.txt",
        health_timer_user="no-such-user-kvtier",
        health_timer_interval="5 fortnights",
    )
    assert rc != 0 and written == {}
    (message,) = failed
    assert message.startswith("health_timer cannot install the timer: ")
    for expected in (
        "health_timer_inventory=inventory/prod must be the absolute path",
        f"health_timer_kvtier={tmp_path}/nowhere/kvtier is not an executable",
        "health_timer_textfile=/var/lib/prometheus/node-exporter/kvtier.txt must be an absolute path ending in .prom",
        "health_timer_user=no-such-user-kvtier is not a user of localhost",
        "health_timer_interval=5 fortnights and health_timer_timeout=5min must be systemd time spans",
    ):
        assert expected in message


def test_an_interval_under_ten_seconds_is_refused(tmp_path, cluster):
    rc, _, failed = run_check(tmp_path, **cluster, health_timer_interval="2s")
    assert rc != 0
    assert "the interval at least 10s" in failed[0]


def test_absent_where_nothing_is_installed_changes_nothing(tmp_path):
    """health_timer_state=absent needs no inventory or kvtier, and on a host without the timer it changes nothing."""
    (tmp_path / "empty.yml").write_text("all: {}\n")
    args = ["playbooks/health_timer.yml", "-i", tmp_path / "empty.yml", "--check", "--diff"]
    rc, report = run_json(tmp_path, *args, "-e", json.dumps({"health_timer_state": "absent"}))
    assert rc == 0
    ran = list(results(report))
    assert [r for r in ran if r.get("changed") or r.get("failed")] == []
    assert any(r.get("stat", {}).get("exists") is False for r in ran)  # it looked for the timer, and found none
