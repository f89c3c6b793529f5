"""kvtier.probes.nvme against outputs recorded in the QEMU VM (tests/fixtures/nvme, see record.py there).

Each scenario directory holds the files the probe read (root/) and the commands it ran (cmd/), so
`collect` runs here exactly as it ran on the VM: 8 drives with serials KVT0000001..8, the root
filesystem on /dev/vda.
"""

import json
import os
import pathlib
import shutil

import pytest

from kvtier.probes import nvme

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "nvme"
SERIALS = ["KVT%07d" % i for i in range(1, 9)]


def cmd_output(scenario, argv):
    index = json.loads((FIX / scenario / "cmd" / "index.json").read_text())
    return (FIX / scenario / "cmd" / index[argv]["stdout"]).read_text()


def replay(scenario, calls=None):
    index = json.loads((FIX / scenario / "cmd" / "index.json").read_text())

    def run(argv):
        if calls is not None:
            calls.append(argv)
        entry = index[" ".join(argv)]
        return entry["rc"], (FIX / scenario / "cmd" / entry["stdout"]).read_text(), entry["stderr"]

    return run


def collect(scenario, **kw):
    return nvme.collect(run=replay(scenario), root=str(FIX / scenario / "root"), **kw)


def drive(facts, serial):
    return next(d for d in facts["drives"] if d["serial"] == serial)


# -- parsers ----------------------------------------------------------------------------------------


def test_flat_nvme_list_from_nvme_cli_2_3():
    ns = nvme.parse_nvme_list(cmd_output("blank", "nvme list -o json"))
    assert [d["name"] for d in ns] == ["nvme%dn1" % i for i in range(8)]
    assert [d["serial"] for d in ns] == SERIALS
    first = ns[0]
    assert first["device"] == "/dev/nvme0n1"
    assert first["model"] == "QEMU NVMe Ctrl"
    assert first["firmware"] == "7.2.22"
    assert first["nsid"] == 1
    assert first["sector_size"] == 512
    assert first["nvme_size_bytes"] == 2 * 1024**3


def test_nested_nvme_list_gives_the_same_drives_plus_controller():
    flat = nvme.parse_nvme_list(cmd_output("blank", "nvme list -o json"))
    nested = nvme.parse_nvme_list((FIX / "nvme-list-v.json").read_text())
    assert [(d["name"], d["serial"], d["model"]) for d in nested] == [
        (d["name"], d["serial"], d["model"]) for d in flat
    ]
    assert nested[0]["controller"] == "nvme0"
    assert nested[0]["transport"] == "pcie"
    assert nested[0]["address"].startswith("0000:00:")
    # recorded while nvme7n1 was formatted with 4 KiB LBAs
    assert nested[7]["sector_size"] == 4096


def test_nvme_list_strips_padding_and_reads_multipath_namespaces():
    doc = {
        "Devices": [
            {
                "HostNQN": "h",
                "Subsystems": [
                    {
                        "Subsystem": "nvme-subsys0",
                        "Controllers": [
                            {
                                "Controller": "nvme0",
                                "SerialNumber": "S1      ",
                                "ModelNumber": "Solidigm SBFPF2BU153T" + " " * 19,
                            }
                        ],
                        "Namespaces": [
                            {
                                "NameSpace": "nvme0n1",
                                "NSID": 1,
                                "SectorSize": 4096,
                                "PhysicalSize": 15360950534144,
                                "Paths": [
                                    {
                                        "Path": "nvme0c0n1",
                                        "Controller": "nvme0",
                                        "SerialNumber": "S1  ",
                                        "ModelNumber": "SOLIDIGM SBFPF2BU153T  ",
                                        "Firmware": "7CV10100",
                                    }
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    (ns,) = nvme.parse_nvme_list(doc)
    assert (ns["name"], ns["serial"], ns["model"], ns["firmware"]) == (
        "nvme0n1",
        "S1",
        "SOLIDIGM SBFPF2BU153T",
        "7CV10100",
    )


def test_empty_nvme_list():
    assert nvme.parse_nvme_list("") == []
    assert nvme.parse_nvme_list('{"Devices":[]}') == []


def test_id_ns_lists_formats_and_the_one_in_use():
    info = nvme.parse_id_ns(cmd_output("blank", "nvme id-ns -o json /dev/nvme0n1"))
    assert [f["data_size"] for f in info["lba_formats"]] == [512] * 4 + [4096] * 4
    assert [f["metadata_size"] for f in info["lba_formats"]] == [0, 8, 16, 64] * 2
    assert info["lba_format_in_use"] == 0
    assert [f["index"] for f in info["lba_formats"] if f["in_use"]] == [0]

    four_k = nvme.parse_id_ns((FIX / "id-ns-4k.json").read_text())
    assert four_k["lba_format_in_use"] == 4
    assert [f["data_size"] for f in four_k["lba_formats"] if f["in_use"]] == [4096]


def test_lba_format_index_uses_the_high_bits_past_16_formats():
    assert nvme.lba_format_in_use(0x04, nlbaf=7) == 4
    assert nvme.lba_format_in_use(0x21, nlbaf=63) == 17  # bits 6:5 = 01 -> +16
    assert nvme.lba_format_in_use(0x21, nlbaf=7) == 1  # fewer than 17 formats: bits 6:5 are not index bits


def test_id_ns_of_newer_nvme_cli_with_in_use_flags():
    doc = {
        "nlbaf": 1,
        "flbas": 0,
        "lbafs": [
            {"lbaf": 0, "ms": 0, "ds": 9, "rp": 2, "in_use": 0},
            {"lbaf": 1, "ms": 0, "ds": 12, "rp": 0, "in_use": 1},
        ],
    }
    info = nvme.parse_id_ns(doc)
    assert [f["in_use"] for f in info["lba_formats"]] == [False, True]


def test_mdstat_healthy_raid0():
    arrays = nvme.parse_mdstat((FIX / "raid0" / "root" / "proc" / "mdstat").read_text())
    md0 = arrays["md0"]
    assert md0["active"] and md0["level"] == "raid0"
    assert md0["chunk_kib"] == 128
    assert md0["blocks"] == 16752640
    assert {n: m["role"] for n, m in md0["members"].items()} == {"nvme%dn1" % i: i for i in range(8)}


def test_mdstat_still_lists_a_hot_removed_raid0_member():
    # The kernel keeps the rdev of a vanished raid0 member: mdstat alone cannot show the failure.
    arrays = nvme.parse_mdstat((FIX / "unplugged" / "root" / "proc" / "mdstat").read_text())
    assert "nvme3n1" in arrays["md0"]["members"]


def test_mdstat_degraded_raid1_and_inactive_array():
    text = (
        "Personalities : [raid1]\n"
        "md1 : active raid1 nvme1n1[1](F) nvme0n1[0]\n"
        "      1046528 blocks super 1.2 [2/1] [U_]\n"
        "      \n"
        "md127 : inactive nvme2n1[0](S)\n"
        "      2095104 blocks super 1.2\n"
        "       \n"
        "unused devices: <none>\n"
    )
    arrays = nvme.parse_mdstat(text)
    assert arrays["md1"]["members"]["nvme1n1"]["flags"] == ["F"]
    assert (arrays["md1"]["raid_disks"], arrays["md1"]["working"], arrays["md1"]["up"]) == (2, 1, "U_")
    assert arrays["md127"]["active"] is False and arrays["md127"]["level"] is None
    assert arrays["md127"]["members"]["nvme2n1"]["flags"] == ["S"]


def test_mdadm_export_has_no_chunk_and_drops_a_vanished_member():
    healthy = nvme.parse_mdadm_export(cmd_output("raid0", "mdadm --detail --export /dev/md0"))
    assert healthy["level"] == "raid0" and healthy["raid_disks"] == 8 and healthy["metadata"] == "1.2"
    assert healthy["md_name"] == "kvtier-fixtures:0"
    assert len(healthy["members"]) == 8 and healthy["members"]["nvme3n1"] == "3"
    assert "chunk" not in json.dumps(healthy)
    gone = nvme.parse_mdadm_export(cmd_output("unplugged", "mdadm --detail --export /dev/md0"))
    assert gone["raid_disks"] == 8 and "nvme3n1" not in gone["members"] and len(gone["members"]) == 7


def test_blkid_export_of_a_raid_member_and_a_partition_table():
    member = nvme.parse_blkid_export(cmd_output("raid0", "blkid -p -o export /dev/nvme0n1"))
    assert (member["type"], member["usage"], member["label"]) == ("linux_raid_member", "raid", "kvtier-fixtures:0")
    table = nvme.parse_blkid_export(cmd_output("used", "blkid -p -o export /dev/nvme6n1"))
    assert table["pttype"] == "dos" and "type" not in table


def test_mounts_unescape_octal():
    (m,) = nvme.parse_mounts("/dev/md0 /srv/kv\\040cache xfs rw,noatime 0 0\n")
    assert (m["source"], m["target"], m["fstype"]) == ("/dev/md0", "/srv/kv cache", "xfs")


def test_by_id_prefers_model_serial_link():
    links = {
        "nvme-QEMU_NVMe_Ctrl_KVT0000001_1": "nvme0n1",
        "nvme-nvme.1b36-4b56-00000001": "nvme0n1",
        "nvme-QEMU_NVMe_Ctrl_KVT0000001": "nvme0n1",
        "nvme-QEMU_NVMe_Ctrl_KVT0000002": "nvme1n1",
    }
    assert nvme.by_id_path(links, "nvme0n1", "KVT0000001") == "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_KVT0000001"
    del links["nvme-QEMU_NVMe_Ctrl_KVT0000001"]
    assert nvme.by_id_path(links, "nvme0n1", "KVT0000001") == "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_KVT0000001_1"
    assert nvme.by_id_path(links, "nvme9n1", "X") is None


# -- collect on recorded systems --------------------------------------------------------------------


def test_blank_drives_are_empty_with_identity_and_geometry():
    facts = collect("blank")
    assert [d["serial"] for d in facts["drives"]] == SERIALS
    assert facts["root_device"] == "vda"
    assert facts["md_arrays"] == {}
    for d in facts["drives"]:
        assert d["empty"] and d["in_use"] == [] and not d["backs_root"]
        assert d["size_bytes"] == 2 * 1024**3
        assert d["by_id"] == "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_" + d["serial"]
        assert (d["logical_block_size"], d["physical_block_size"]) == (512, 512)
        assert d["lba_format_in_use"] == 0


def test_used_drives_report_partitions_signatures_and_mounts():
    facts = collect("used")
    fs = drive(facts, "KVT0000006")  # nvme5n1: whole-disk XFS, not mounted
    assert not fs["empty"] and fs["mounts"] == []
    assert [s["type"] for s in fs["signatures"]] == ["xfs"]
    part = drive(facts, "KVT0000007")  # nvme6n1: MBR, ext4 partition mounted at /mnt/p1
    assert part["partitions"] == ["nvme6n1p1"]
    assert [m["target"] for m in part["mounts"]] == ["/mnt/p1"]
    assert {s["device"]: s.get("type") or s.get("pttype") for s in part["signatures"]} == {
        "/dev/nvme6n1": "dos",
        "/dev/nvme6n1p1": "ext4",
    }
    assert "mounted at /mnt/p1 (via nvme6n1p1)" in part["in_use"]
    assert [d["serial"] for d in facts["drives"] if d["empty"]] == [
        s for s in SERIALS if s not in ("KVT0000006", "KVT0000007")
    ]


def test_healthy_raid0_reports_chunk_members_and_a_record():
    facts = collect("raid0")
    md0 = facts["md_arrays"]["md0"]
    assert (md0["level"], md0["raid_disks"], md0["chunk_bytes"]) == ("raid0", 8, 131072)
    assert (md0["health"], md0["broken"], md0["array_state"]) == ("healthy", False, "clean")
    assert md0["member_serials"] == SERIALS  # by role: nvme0n1 was given role 0, ...
    assert md0["missing"] == [] and md0["missing_serials"] == []
    assert md0["mounts"] == [{"target": "/srv/nfs", "fstype": "xfs"}]
    assert md0["record"]["members"][3] == {"role": 3, "serial": "KVT0000004"}
    assert md0["record"]["uuid"] == md0["uuid"]
    for d in facts["drives"]:
        assert d["md_arrays"] == ["md0"] and not d["empty"]
        assert "mounted at /srv/nfs (via md0)" in d["in_use"]


def test_unplugged_member_breaks_raid0_before_any_io_notices():
    facts = collect("unplugged", expected_serials=SERIALS)
    md0 = facts["md_arrays"]["md0"]
    assert md0["array_state"] == "clean"  # the kernel has not noticed yet
    assert md0["health"] == "broken" and md0["broken"]
    assert md0["missing"] == [{"role": 3, "name": "nvme3n1", "serial": None, "reason": "gone"}]
    assert md0["record"] is None
    assert facts["missing_serials"] == ["KVT0000004"]
    assert len(facts["drives"]) == 7


def test_record_saved_while_healthy_names_the_missing_serial(tmp_path):
    record = collect("raid0")["md_arrays"]["md0"]["record"]
    root = tmp_path / "root"
    shutil.copytree(FIX / "unplugged" / "root", root, symlinks=True)
    records = root / "var" / "lib" / "kvtier" / "md"
    records.mkdir(parents=True)
    (records / "store.json").write_text(json.dumps(record))
    (records / "junk.json").write_text("not json")
    facts = nvme.collect(run=replay("unplugged"), root=str(root))
    md0 = facts["md_arrays"]["md0"]
    assert md0["record_found"]
    assert md0["missing"] == [{"role": 3, "name": "nvme3n1", "serial": "KVT0000004", "reason": "gone"}]
    assert md0["missing_serials"] == ["KVT0000004"]
    assert md0["member_serials"] == SERIALS


def test_broken_after_io_reports_kernel_state():
    md0 = collect("broken")["md_arrays"]["md0"]
    assert (md0["array_state"], md0["health"]) == ("broken", "broken")


def test_commands_run_are_read_only():
    calls = []
    nvme.collect(run=replay("raid0", calls), root=str(FIX / "raid0" / "root"))
    assert {c[0] for c in calls} == {"nvme", "blkid", "mdadm"}
    assert all(c[:2] in (["nvme", "list"], ["nvme", "id-ns"], ["blkid", "-p"], ["mdadm", "--detail"]) for c in calls)


def test_missing_tools_say_what_to_install():
    with pytest.raises(nvme.ProbeError, match="install the nvme-cli package"):
        nvme.collect(run=lambda argv: (127, "", "not found"), root=str(FIX / "blank" / "root"))

    def no_blkid(argv):
        return (127, "", "") if argv[0] == "blkid" else replay("blank")(argv)

    with pytest.raises(nvme.ProbeError, match="util-linux"):
        nvme.collect(run=no_blkid, root=str(FIX / "blank" / "root"))


# -- synthetic layouts the VM cannot show (its root is on virtio) ------------------------------------


def fake_system(tmp_path, mounts, tree, links=()):
    """A minimal sysfs/procfs: tree maps sysfs-relative paths to file contents."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "mounts").write_text(mounts)
    for rel, text in tree.items():
        p = root / "sys" / "block" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for src, dst in links:
        (root / os.path.dirname(src)).mkdir(parents=True, exist_ok=True)
        os.symlink(dst, root / src)
    return str(root)


def one_drive_run(argv):
    if argv[:2] == ["nvme", "list"]:
        return (
            0,
            json.dumps(
                {
                    "Devices": [
                        {
                            "NameSpace": 1,
                            "DevicePath": "/dev/nvme0n1",
                            "SerialNumber": "S0",
                            "ModelNumber": "M",
                            "Firmware": "F",
                            "SectorSize": 512,
                        }
                    ]
                }
            ),
            "",
        )
    return 2, "", ""  # no id-ns, no signatures, no mdadm


def test_root_on_lvm_over_a_partition_is_detected(tmp_path):
    root = fake_system(
        tmp_path,
        "/dev/mapper/vg-root / ext4 rw 0 0\n",
        {
            "nvme0n1/size": "100",
            "nvme0n1/nvme0n1p2/partition": "2",
            "nvme0n1/nvme0n1p2/holders/dm-0": "",
            "dm-0/size": "50",
        },
        links=[("dev/mapper/vg-root", "../dm-0")],
    )
    (d,) = nvme.collect(run=one_drive_run, root=root, id_ns=False)["drives"]
    assert d["backs_root"] and not d["empty"]
    assert d["in_use"][0] == "backs the root filesystem"
    assert d["holders"] == ["dm-0"]


def test_root_on_md_over_partitions_is_detected(tmp_path):
    root = fake_system(
        tmp_path,
        "/dev/md127 / ext4 rw 0 0\n",
        {
            "nvme0n1/size": "100",
            "nvme0n1/nvme0n1p1/partition": "1",
            "nvme0n1/nvme0n1p1/holders/md127": "",
            "md127/size": "90",
            "md127/md/level": "raid1",
            "md127/md/raid_disks": "2",
            "md127/md/array_state": "clean",
            "md127/md/dev-nvme0n1p1/slot": "0",
            "md127/md/dev-nvme0n1p1/state": "in_sync",
        },
    )
    facts = nvme.collect(run=one_drive_run, root=root, id_ns=False)
    (d,) = facts["drives"]
    assert d["backs_root"] and d["md_arrays"] == ["md127"]
    md = facts["md_arrays"]["md127"]
    # raid1 with one of two members never added: degraded, not broken; the partition maps to the drive's serial
    assert md["health"] == "degraded"
    assert md["member_serials"] == ["S0", None]
    assert md["missing"] == [{"role": 1, "name": None, "serial": None, "reason": "gone"}]


def test_raid5_faulty_member_and_lost_redundancy():
    members = [
        {"name": "a", "slot": 0, "state": "in_sync"},
        {"name": "b", "slot": 1, "state": "faulty"},
        {"name": "c", "slot": 2, "state": "in_sync"},
    ]
    sysmd = {"level": "raid5", "raid_disks": 3, "array_state": "clean", "members": members}
    one = nvme.md_facts("md1", sysmd, {}, {}, {"a": "A", "b": "B", "c": "C"}, None)
    assert one["health"] == "degraded" and one["missing"][0]["reason"] == "faulty"
    assert one["missing_serials"] == ["B"]
    members[2]["state"] = "faulty"
    two = nvme.md_facts("md1", sysmd, {}, {}, {"a": "A", "b": "B", "c": "C"}, None)
    assert two["health"] == "broken" and two["missing_serials"] == ["B", "C"]


def test_inactive_array():
    sysmd = {"level": None, "raid_disks": 0, "array_state": "inactive", "members": [{"name": "x", "slot": None}]}
    assert nvme.md_facts("md127", sysmd, {}, {"active": False}, {}, None)["health"] == "inactive"


# -- the module ---------------------------------------------------------------------------------------


def run_module(monkeypatch, capsys, args, fake_collect):
    import nvme_facts
    from ansible.module_utils.testing import patch_module_args

    monkeypatch.setattr(nvme_facts, "collect", fake_collect)
    with patch_module_args(args), pytest.raises(SystemExit):
        nvme_facts.main()
    return json.loads(capsys.readouterr().out)


def test_module_returns_facts_unchanged_in_check_mode(monkeypatch, capsys):
    seen = {}

    def fake(run, **kw):
        seen.update(kw)
        return collect("raid0", **kw)

    out = run_module(monkeypatch, capsys, {"_ansible_check_mode": True, "expected_serials": SERIALS}, fake)
    assert out["changed"] is False and "failed" not in out
    assert out["ansible_facts"]["kvtier_nvme"]["md_arrays"]["md0"]["health"] == "healthy"
    assert seen == {"expected_serials": SERIALS, "record_dir": "/var/lib/kvtier/md", "id_ns": True}


def test_module_fails_with_the_probe_message(monkeypatch, capsys):
    def fake(run, **kw):
        raise nvme.ProbeError("nvme-cli is not installed on this host: install the nvme-cli package")

    out = run_module(monkeypatch, capsys, {}, fake)
    assert out["failed"] and "install the nvme-cli package" in out["msg"]
