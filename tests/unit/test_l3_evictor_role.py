"""The l3_evictor role in check mode on this machine: the units it would write (systemd accepts them, the budget is
the one asked for) and bad settings refused before anything is written."""

import json
import subprocess

from ._playbook import check_units, results, run_json

UNITS = ("kvtier-l3-evictor.service", "kvtier-l3-evictor.timer")


def run_check(tmp_path, **extravars):
    """(return code, {unit file name: text it would write}, failure messages) of the role in --check --diff."""
    playbook = tmp_path / "evictor.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [l3_evictor]\n")
    (tmp_path / "empty.yml").write_text("all: {}\n")
    extravars = {"l3_evictor_path": str(tmp_path / "pool"), **extravars}
    return check_units(tmp_path, playbook, "-i", tmp_path / "empty.yml", "-e", json.dumps(extravars))


def test_check_mode_shows_units_that_systemd_accepts(tmp_path):
    rc, written, failed = run_check(tmp_path)
    assert (rc, failed) == (0, [])
    assert sorted(written) == sorted(UNITS)
    service = written["kvtier-l3-evictor.service"]
    assert (
        f"kvtier_l3_evictor.py {tmp_path / 'pool'} --budget-fraction 0.9 --high 0.9 --low 0.75 --min-age 60" in service
    )
    assert f"RequiresMountsFor={tmp_path / 'pool'}" in service
    assert "OnUnitInactiveSec=1min" in written["kvtier-l3-evictor.timer"]
    units = tmp_path / "units"
    units.mkdir()
    for name, text in written.items():
        (units / name).write_text(text)
    verify = subprocess.run(
        ["systemd-analyze", "verify", *(str(units / name) for name in UNITS)], capture_output=True, text=True
    )
    # The script is not installed here (check mode): that one complaint aside, systemd accepts every directive.
    complaints = [
        line
        for line in verify.stderr.splitlines()
        if "kvtier-l3-evictor" in line and "kvtier_l3_evictor.py" not in line
    ]
    assert complaints == [], verify.stderr


def test_an_explicit_budget_replaces_the_share_of_the_file_system(tmp_path):
    rc, written, _ = run_check(tmp_path, l3_evictor_budget_bytes=80_000_000_000_000)
    assert rc == 0
    assert "--budget-bytes 80000000000000 --high" in written["kvtier-l3-evictor.service"]


def test_bad_settings_are_refused_before_anything_is_written(tmp_path):
    rc, written, failed = run_check(
        tmp_path, l3_evictor_high_watermark=0.5, l3_evictor_low_watermark=0.7, l3_evictor_path="srv/kvcache"
    )
    assert rc != 0 and written == {}
    assert any("l3_evictor_low_watermark (0.7) < l3_evictor_high_watermark (0.5)" in m for m in failed), failed


def test_an_evictor_host_outside_the_inventory_is_refused(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "spark:\n  hosts:\n    spark01:\n      ansible_connection: local\n"
        "  vars:\n    kvtier_cluster: {tiers: [l0, l3]}\n    kvtier_l3_evictor_node: storage09\n"
    )
    rc, report = run_json(tmp_path, "playbooks/l3_evictor.yml", "-i", inventory, "--check")
    failed = [str(r.get("msg")) for r in results(report) if r.get("failed")]
    assert rc != 0
    assert any("kvtier_l3_evictor_node=storage09 is not an inventory host" in m for m in failed), failed
