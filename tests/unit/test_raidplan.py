"""The RAID planner: which drives it takes, when it refuses, and what it would run."""

import pytest

from kvtier.probes.raidplan import plan

SPEC = dict(
    name="kvcache",
    serials=[],
    model_pattern="^SOLIDIGM SBFP",
    count=4,
    chunk_kib=128,
    allow_destroy=False,
    format_4k=False,
)


def drive(n, model="SOLIDIGM SBFPF2BV153T", **kw):
    d = dict(
        name=f"nvme{n}n1",
        device=f"/dev/nvme{n}n1",
        serial=f"SN{n:04d}",
        model=model,
        by_id=f"/dev/disk/by-id/nvme-{model.replace(' ', '_')}_SN{n:04d}",
        minimum_io_size=4096,
        lba_formats=[
            {"index": 0, "data_size": 512, "metadata_size": 0},
            {"index": 1, "data_size": 4096, "metadata_size": 0},
        ],
        lba_format_in_use=0,
        partitions=[],
        signatures=[],
        md_arrays=[],
        holders=[],
        mounts=[],
        backs_root=False,
        in_use=[],
        empty=True,
    )
    d.update(kw)
    return d


def facts(drives, arrays=None):
    return {"drives": drives, "md_arrays": arrays or {}}


def spec(**kw):
    return dict(SPEC, **kw)


def healthy_array(serials, chunk=128 * 1024, **kw):
    a = dict(
        name="md127",
        device="/dev/md127",
        md_name="storage:kvcache",
        level="raid0",
        raid_disks=len(serials),
        chunk_bytes=chunk,
        health="healthy",
        member_serials=list(serials),
        missing=[],
    )
    a.update(kw)
    return a


def test_creates_on_empty_drives_selected_by_model():
    drives = [drive(i) for i in range(4)] + [drive(9, model="Samsung SSD 990 PRO")]
    p = plan(facts(drives), spec())
    assert p["problems"] == []
    assert p["action"] == "create"
    assert p["create_argv"][:9] == [
        "mdadm",
        "--create",
        "/dev/md/kvcache",
        "--run",
        "--level=0",
        "--raid-devices=4",
        "--chunk=128K",
        "--metadata=1.2",
        "--name=kvcache",
    ]
    assert p["create_argv"][9:] == [d["by_id"] for d in drives[:4]]  # stable paths, never nvmeXn1 order


def test_model_count_must_be_exact():
    p = plan(facts([drive(i) for i in range(3)]), spec())
    assert p["action"] == "refuse"
    assert "found 3 drive(s) whose model matches '^SOLIDIGM SBFP'" in p["problems"][0]
    assert "expected exactly 4" in p["problems"][0]


def test_serials_select_exactly_and_missing_ones_are_named():
    drives = [drive(i) for i in range(6)]
    p = plan(facts(drives), spec(serials=["SN0001", "SN0003"]))
    assert [m["serial"] for m in p["members"]] == ["SN0001", "SN0003"]
    p = plan(facts(drives), spec(serials=["SN0001", "SN0042"]))
    assert p["action"] == "refuse"
    assert p["problems"][0].startswith("serial(s) SN0042 not found on this host")


def test_root_drive_is_refused_even_with_allow_destroy():
    drives = [drive(i) for i in range(3)] + [
        drive(3, backs_root=True, empty=False, in_use=["backs the root filesystem"])
    ]
    p = plan(facts(drives), spec(allow_destroy=True))
    assert p["action"] == "refuse"
    assert any("SN0003 (/dev/nvme3n1) backs the root filesystem" in m for m in p["problems"])


def test_drive_with_a_filesystem_is_refused_without_allow_destroy():
    busy = drive(
        2,
        empty=False,
        signatures=[{"type": "ext4", "device": "/dev/nvme2n1"}],
        in_use=["ext4 signature on /dev/nvme2n1"],
    )
    drives = [drive(0), drive(1), busy, drive(3)]
    p = plan(facts(drives), spec())
    assert p["action"] == "refuse"
    assert p["create_argv"] == []
    assert "drive SN0002 (/dev/nvme2n1) is not empty (ext4 signature on /dev/nvme2n1)" in p["problems"][0]
    assert "nvme_raid_allow_destroy" in p["problems"][0]
    p = plan(facts(drives), spec(allow_destroy=True))
    assert p["action"] == "create"
    assert p["wipe"] == ["/dev/nvme2n1"]


def test_mounted_drive_is_refused_even_with_allow_destroy():
    busy = drive(1, empty=False, mounts=[{"target": "/data"}], in_use=["mounted at /data (via nvme1n1)"])
    p = plan(facts([drive(0), busy, drive(2), drive(3)]), spec(allow_destroy=True))
    assert p["action"] == "refuse"
    assert "is in use (mounted at /data (via nvme1n1)); unmount" in p["problems"][0]


def test_matching_array_is_adopted_not_recreated():
    drives = [drive(i, empty=False, md_arrays=["md127"]) for i in range(4)]
    array = healthy_array([d["serial"] for d in drives])
    p = plan(facts(drives, {"md127": array}), spec())
    assert p["problems"] == []
    assert p["action"] == "adopt"
    assert p["device"] == "/dev/md127"
    assert p["create_argv"] == []


def test_differing_array_is_an_error_that_says_how():
    drives = [drive(i, empty=False, md_arrays=["md127"]) for i in range(4)]
    array = healthy_array([d["serial"] for d in drives], chunk=512 * 1024)
    p = plan(facts(drives, {"md127": array}), spec())
    assert p["action"] == "refuse"
    assert "chunk is 512 KiB, spec is 128 KiB" in p["problems"][0]
    assert "mdadm --stop /dev/md127" in p["problems"][0]


def test_broken_array_names_the_missing_serial():
    drives = [drive(i, empty=False, md_arrays=["md127"]) for i in (0, 1, 3)]
    array = healthy_array(
        ["SN0000", "SN0001", "SN0002", "SN0003"],
        health="broken",
        missing=[{"role": 2, "serial": "SN0002", "name": None}],
    )
    p = plan(facts(drives, {"md127": array}), spec(serials=["SN0000", "SN0001", "SN0002", "SN0003"]))
    assert p["action"] == "refuse"
    assert any("is broken: missing member(s) SN0002 (role 2)" in m for m in p["problems"])


@pytest.mark.parametrize("chunk, message", [(96, "not a power of two"), (2, "not a power of two multiple of 4 KiB")])
def test_bad_chunk_is_refused(chunk, message):
    p = plan(facts([drive(i) for i in range(4)]), spec(chunk_kib=chunk))
    assert p["action"] == "refuse"
    assert message in p["problems"][0]


def test_chunk_must_be_a_multiple_of_the_drive_minimum_io():
    drives = [drive(i, minimum_io_size=65536) for i in range(4)]
    p = plan(facts(drives), spec(chunk_kib=32))
    assert "not a multiple of the minimum I/O size of SN0000 (/dev/nvme0n1) (65536 bytes)" in p["problems"][0]


def test_format_4k_lists_only_drives_not_already_4k():
    drives = [drive(0), drive(1, lba_format_in_use=1), drive(2), drive(3)]
    p = plan(facts(drives), spec(format_4k=True))
    assert p["format"] == [{"device": f"/dev/nvme{i}n1", "lbaf": 1} for i in (0, 2, 3)]
    no4k = [drive(i, lba_formats=[{"index": 0, "data_size": 512, "metadata_size": 0}]) for i in range(4)]
    p = plan(facts(no4k), spec(format_4k=True))
    assert "offers no 4 KiB LBA format" in p["problems"][0]
