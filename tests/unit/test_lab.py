"""The lab's generated inventory is one a real site.yml run accepts, and its report never hides a tier."""

import ipaddress
import json
import shutil
import subprocess

import pytest
import yaml

from kvtier.lab import credentials, diagnostics, fabric, hosts
from kvtier.lab import inventory as layout
from kvtier.lab.stages import StageFailed, Stages
from kvtier.nodes import transport
from tests.unit.test_preflight_playbook import run_preflight


class FakeVM:
    """Only what the inventory needs of a started VM (no QEMU here)."""

    def instance_config(self):
        return {
            "instance": layout.STORAGE,
            "address": "127.0.0.1",
            "user": "root",
            "port": 2222,
            "identity_file": "/nonexistent/key",
        }


def lab_inventory(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "STATE", tmp_path / "state")
    inventory_dir = tmp_path / "lab"
    shutil.copytree(layout.INVENTORY_DIR / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "hosts.yml").write_text(yaml.safe_dump(layout.render(FakeVM())))
    return inventory_dir


def test_lab_inventory_passes_preflight(tmp_path, monkeypatch):
    assert run_preflight(tmp_path, lab_inventory(tmp_path, monkeypatch)) == (0, [])


def test_lab_addresses_are_on_the_lab_network_and_distinct():
    network = ipaddress.ip_network(fabric.SUBNET)
    addresses = [layout.STORAGE_DATA_ADDRESS, *layout.SPARKS.values()]
    assert len(set(addresses)) == len(addresses)
    assert all(ipaddress.ip_address(a) in network for a in addresses)
    assert ipaddress.ip_address(layout.STORAGE_DATA_ADDRESS) != next(network.hosts())  # .1 is the bridge itself


def test_lab_secrets_are_generated_once_and_private(tmp_path):
    first = credentials.passwords(tmp_path)
    assert credentials.passwords(tmp_path) == first
    assert all(len(v) >= 24 and v != "changeme" for v in first.values())
    assert len(set(first.values())) == len(first)
    assert (tmp_path / "secrets.json").stat().st_mode & 0o077 == 0
    # A lab made before a secret existed gets it added; the others stay.
    older = {k: v for k, v in first.items() if k != "router_stats_password"}
    (tmp_path / "secrets.json").write_text(json.dumps(older))
    again = credentials.passwords(tmp_path)
    assert {k: again[k] for k in older} == older and len(again["router_stats_password"]) >= 24


def test_lab_router_certificate_names_its_address_and_keeps_its_key_private(tmp_path):
    cert, key = credentials.certificate(tmp_path, "10.213.7.10")
    text = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-text"], capture_output=True, text=True)
    assert "IP Address:10.213.7.10" in text.stdout
    assert key.stat().st_mode & 0o077 == 0
    assert credentials.certificate(tmp_path, "10.213.7.10") == (cert, key) and cert.read_text() == cert.read_text()
    values = credentials.inventory_vars(tmp_path, "10.213.7.10")
    assert [t["name"] for t in values["router_tenants"]] == list(credentials.TENANTS)
    assert not any(name.startswith("tenant_key_") for name in values)


def test_the_proof_reads_the_lab_from_its_inventory_like_any_cluster(tmp_path, monkeypatch):
    inventory = lab_inventory(tmp_path, monkeypatch)
    monkeypatch.setattr(layout, "INVENTORY", inventory / "hosts.yml")
    cluster = yaml.safe_load((layout.INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())["kvtier_cluster"]
    t = layout.proof_target()
    # The lab spec names no L2 endpoint: it derives from the storage VM's address and kv_store's defaults.
    assert "host" not in cluster["l2"] and "port" not in cluster["l2"]
    assert (t.spec.l2.host, t.spec.l2.port, t.spec.l2.user) == (layout.STORAGE_DATA_ADDRESS, 6379, "lmcache")
    assert t.l2_admin_user == "kvtier-admin"
    assert t.vllm_url("spark01") == f"http://127.0.0.1:{cluster['ports']['vllm_http']}"
    assert t.spec.l3.path == cluster["l3"]["path"] and t.l2_name == cluster["l2"]["adapter"]
    assert t.l2_admin_password == credentials.passwords(layout.STATE)["kv_store_admin_password"]
    argv = t.nodes["spark02"].argv("true")  # over SSH, as Ansible reaches it
    # As an unprivileged login user that becomes root, as on a real cluster.
    assert argv[0] == "ssh" and argv[-2:] == [f"kvtier@{layout.SPARKS['spark02']}", "sudo -n true"]
    assert argv[argv.index("-i") + 1] == FakeVM().instance_config()["identity_file"]


def test_site_yml_runs_again_only_when_its_inputs_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "REPO", tmp_path)
    (tmp_path / "roles" / "kv_store").mkdir(parents=True)
    task = tmp_path / "roles" / "kv_store" / "main.yml"
    task.write_text("- name: a task\n")
    first = hosts.inputs_digest()
    assert hosts.inputs_digest() == first
    task.write_text("- name: another task\n")
    assert hosts.inputs_digest() != first


def test_stages_report_each_stage_and_a_failure_stops_the_run():
    lines = []
    stages = Stages(lines.append)
    assert stages.run("first", lambda: "a note") == "a note"
    stages.skip("second", "nothing changed")
    with pytest.raises(StageFailed):
        stages.run("third", lambda: (_ for _ in ()).throw(StageFailed("changed 2 task(s)\nmore")))
    stages.report("kvtier lab test")
    assert not stages.ok
    assert any(line.strip().startswith("kvtier lab test: FAILED in ") for line in lines)
    rows = [line for line in lines if line.startswith("  ")]
    assert rows[0].split()[:2] == ["first", "ok"] and rows[0].endswith("a note")
    assert rows[1].split()[:2] == ["second", "skipped"]
    assert rows[2].split()[:2] == ["third", "FAILED"] and rows[2].endswith("changed 2 task(s)")


def test_the_medium_lab_model_changes_only_the_model_and_its_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "MODEL_VARS", tmp_path / "zz-model.yml")
    monkeypatch.setattr(layout, "REPO", tmp_path.parent)
    layout.use_model("medium")
    written = yaml.safe_load(layout.MODEL_VARS.read_text())
    default = yaml.safe_load((layout.INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())["kvtier_cluster"]
    cluster = written["kvtier_cluster"]
    assert written["vllm_lmcache_lab_model"] == "medium"
    assert cluster["model"] == dict(default["model"], id="medium", path="/opt/kvtier/models/medium", weights_gib=0.11)
    assert (
        cluster["lmcache"]["l0_dram_gib"] == 1 and cluster["lmcache"]["chunk_size"] == default["lmcache"]["chunk_size"]
    )
    assert {k: v for k, v in cluster.items() if k not in ("model", "vllm", "lmcache")} == {
        k: v for k, v in default.items() if k not in ("model", "vllm", "lmcache")
    }
    layout.use_model("tiny")
    assert not layout.MODEL_VARS.exists()
    with pytest.raises(StageFailed, match="unknown lab model"):
        layout.use_model("huge")


def test_a_failed_stage_shows_the_serving_units_last_warnings_and_errors(monkeypatch):
    """What a CI log's end carries of each Spark's journals (recorded lines of LMCache 0.5.6 and vLLM 0.32.0)."""
    journals = {
        "kvtier-lmcache.service": "INFO started\n"
        + "\x1b[33;20m[2026-12-06 22:30:42,060] LMCache WARNING:\x1b[0m Coordinator heartbeat failed\n" * 4,
        "kvtier-vllm.service": "WARNING [cpu.py:224] Triton is not installed.\nINFO serving\n",
    }

    class Node:
        def run(self, *argv, timeout=None):
            if "spark02" in self.name:
                raise transport.NodeError("spark02: container not running")
            return journals[argv[argv.index("--unit") + 1]]

    spark01, spark02 = Node(), Node()
    spark01.name, spark02.name = "spark01", "spark02"

    class Target:
        nodes = {"spark01": spark01, "spark02": spark02}
        units = {"lmcache": "kvtier-lmcache.service", "vllm": "kvtier-vllm.service"}

    monkeypatch.setattr(diagnostics, "proof_target", Target)
    lines: list = []
    diagnostics.journal_digest(lines.append)
    assert lines[1:] == [
        "  spark01 kvtier-lmcache.service: [2026-12-06 22:30:42,060] LMCache WARNING: Coordinator heartbeat failed",
    ] * 3 + [
        "  spark01 kvtier-vllm.service: nothing",  # its start-up warnings are not worth the lines
        "  spark02 kvtier-lmcache.service: journal not read (spark02: container not running)",
        "  spark02 kvtier-vllm.service: journal not read (spark02: container not running)",
    ]


def test_a_failed_stage_shows_the_storage_vms_kernel_on_its_drives(tmp_path, monkeypatch):
    """Stalled drive I/O, read from the VM's serial console on the host (lines in the 6.1 kernel's words)."""
    monkeypatch.setenv("KVTIER_VM_STATE", str(tmp_path))
    (tmp_path / "kvtier-storage").mkdir()
    (tmp_path / "kvtier-storage" / "console.log").write_text(
        "[   27.11] nvme nvme0: 1/0/0 default/read/poll queues\n"
        "kvtier-storage login: [  612.40] nvme nvme3: I/O 17 QID 1 timeout, completion polled\n"
        "[  650.02] XFS (md127): Ending clean mount\n"
        "Started Reset failed units.\n"  # systemd's words on the console are not the kernel's
        "[  700.93] nvme nvme5: I/O 4 QID 1 timeout, reset controller\n"
    )
    lines: list = []
    diagnostics.kernel_digest(lines.append, "kvtier-storage")
    assert lines[1:] == [
        "  kvtier-storage: kvtier-storage login: [  612.40] nvme nvme3: I/O 17 QID 1 timeout, completion polled",
        "  kvtier-storage: [  700.93] nvme nvme5: I/O 4 QID 1 timeout, reset controller",
    ]
    (tmp_path / "kvtier-storage" / "console.log").write_text("[   27.11] nvme nvme0: 1/0/0 default/read/poll queues\n")
    lines.clear()
    diagnostics.kernel_digest(lines.append, "kvtier-storage")
    assert lines[1:] == ["  kvtier-storage: nothing"]


def test_the_operator_gets_the_lab_inventory_with_the_key_where_they_keep_it():
    from kvtier.lab import operator_install

    inventory = {
        "all": {
            "children": {
                "storage": {"hosts": {"st": {"ansible_ssh_private_key_file": "/root/.cache/k", "ansible_port": 2222}}},
                "spark": {"hosts": {"s1": {"ansible_ssh_private_key_file": "/root/.cache/k"}}},
            }
        }
    }
    mine, theirs = operator_install.as_operator(inventory, "/home/ops/.ssh/lab_key")
    assert theirs == "/root/.cache/k"
    assert {
        h["ansible_ssh_private_key_file"] for g in mine["all"]["children"].values() for h in g["hosts"].values()
    } == {"/home/ops/.ssh/lab_key"}
    assert mine["all"]["children"]["storage"]["hosts"]["st"]["ansible_port"] == 2222
    inventory["all"]["children"]["spark"]["hosts"]["s1"]["ansible_ssh_private_key_file"] = "/elsewhere"
    inventory["all"]["children"]["storage"]["hosts"]["st"]["ansible_ssh_private_key_file"] = "/root/.cache/k"
    with pytest.raises(StageFailed, match="names 2 keys"):
        operator_install.as_operator(inventory, "/home/ops/.ssh/lab_key")


def test_the_kernels_command_line_is_not_a_drive_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_VM_STATE", str(tmp_path))
    (tmp_path / "vm").mkdir()
    (tmp_path / "vm" / "console.log").write_text(
        "[    0.000000] Command line: root=/dev/vda console=ttyS0 nvme_core.io_timeout=5\n"
        "[  722.18] nvme nvme2: I/O 772 (I/O Cmd) QID 1 timeout, aborting\n"
        "[  722.19] nvme nvme2: Abort status: 0x0\n"
    )
    lines: list = []
    diagnostics.kernel_digest(lines.append, "vm")
    assert [line.split(": ", 1)[1] for line in lines[1:]] == [
        "[  722.18] nvme nvme2: I/O 772 (I/O Cmd) QID 1 timeout, aborting",
        "[  722.19] nvme nvme2: Abort status: 0x0",
    ]
