"""kvtier.probes.nfs and the nfs_mount_facts module against /proc files recorded in the QEMU VMs.

tests/fixtures/nfs/<case>/ holds /proc/mounts and /proc/self/mountstats read on kvt-nfs-client
(Debian 12, kernel 6.1) by record.sh there:
  rdma/  the share mounted by nfs_client (vers=4.2,proto=rdma,port=20049) over soft-RoCE, after I/O;
  tcp/   the rxe link deleted and the share mounted with proto=tcp there (test_nfs_probe_tcp.py).
"""

import json
import pathlib

import pytest

from kvtier.probes import nfs

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "nfs"
MNT = "/mnt/kvcache"


def facts(case, path=MNT):
    return nfs.mount_facts(path, mounts_path=str(FIX / case / "mounts"), mountstats_path=str(FIX / case / "mountstats"))


# -- recorded mounts ----------------------------------------------------------------------------------


def test_rdma_mount_is_recognised_with_its_counters():
    f = facts("rdma")
    assert f["mounted"] and f["nfs"] and f["fstype"] == "nfs4"
    assert f["source"] == "192.168.77.1:/srv/kvcache"
    assert (f["proto"], f["port"], f["vers"], f["xprt"]) == ("rdma", 20049, "4.2", "rdma")
    assert f["rdma"] is True
    assert f["options"]["clientaddr"] == "192.168.77.2"
    counters = f["xprts"][0]["counters"]
    # Every field of the kernel's rdma xprt line got a name, and the I/O shows up in them.
    assert len(counters) == len(nfs.XPRT_FIELDS["rdma"])
    assert counters["sends"] > 0 and counters["recvs"] > 0
    assert counters["connect_count"] >= 1
    assert nfs.problems(f, port=20049, vers="4.2") == []


def test_wrong_version_and_port_are_named():
    f = facts("rdma")
    assert nfs.problems(f, port=2050, vers="4.1") == [
        "/mnt/kvcache is mounted with NFS vers=4.2, expected vers=4.1 (remount it)",
        "/mnt/kvcache uses RDMA on port 20049, expected 2050 (the server's rdma-port)",
    ]


def test_other_paths_are_not_mounted_or_not_nfs():
    assert nfs.problems(facts("rdma", "/mnt/other")) == [
        "nothing is mounted at /mnt/other: run `mount /mnt/other` and read the kernel log (dmesg) for the reason"
    ]
    root = facts("rdma", "/")
    assert root["mounted"] and not root["nfs"]
    assert nfs.problems(root) == ["/ is a ext4 mount of /dev/vda, not NFS"]


def test_trailing_slash_is_the_same_mount():
    assert facts("rdma", MNT + "/")["rdma"] is True


# -- parser edge cases --------------------------------------------------------------------------------


def test_escaped_paths_and_the_last_mount_wins():
    mounts = (
        "srv:/a /mnt/my\\040cache nfs4 rw,vers=4.2,proto=tcp,port=2049 0 0\n"
        "srv:/a /mnt/my\\040cache nfs4 rw,vers=4.2,proto=rdma,port=20049 0 0\n"
    )
    stats = (
        "device srv:/a mounted on /mnt/my\\040cache with fstype nfs4 statvers=1.1\n"
        "\topts:\trw,vers=4.2,proto=rdma\n\txprt:\trdma 0 0 1 0 0 5 5 0 5 0\n"
    )
    f = nfs.describe("/mnt/my cache", mounts, stats)
    assert f["proto"] == "rdma" and f["rdma"] is True
    # An unknown layout (another kernel) keeps the shared fields and the raw values.
    assert f["xprts"][0]["counters"]["sends"] == 5 and f["xprts"][0]["raw"][5] == 5


def test_proto_rdma_without_an_xprt_line_is_not_proof():
    mounts = "srv:/a /mnt/x nfs4 rw,vers=4.2,proto=rdma,port=20049 0 0\n"
    f = nfs.describe("/mnt/x", mounts, "")
    assert f["rdma"] is False
    assert "has no xprt line" in nfs.problems(f)[0]


def test_mixed_transports_are_not_rdma():
    mounts = "srv:/a /mnt/x nfs4 rw,vers=4.2,proto=rdma,port=20049 0 0\n"
    stats = (
        "device srv:/a mounted on /mnt/x with fstype nfs4 statvers=1.1\n"
        "\txprt:\trdma 0 0 1 0 0 5 5 0 5 0\n\txprt:\ttcp 0 0 1 0 0 5 5 0 5 0 1 0 0\n"
    )
    f = nfs.describe("/mnt/x", mounts, stats)
    assert f["rdma"] is False and f["xprt"] == "rdma"
    assert "over RDMA+TCP, not RDMA (proto=rdma, xprt rdma+tcp)" in nfs.problems(f)[0]


def test_bad_xprt_line_is_rejected():
    with pytest.raises(ValueError):
        nfs.parse_xprt("opts: rw")


def test_unreadable_proc_file_is_a_mount_error(tmp_path):
    with pytest.raises(nfs.MountError, match="cannot read"):
        nfs.mount_facts(MNT, mounts_path=str(tmp_path / "none"), mountstats_path=str(tmp_path / "none"))


# -- the module ---------------------------------------------------------------------------------------


def run_module(monkeypatch, capsys, args, case):
    import nfs_mount_facts
    from ansible.module_utils.testing import patch_module_args

    monkeypatch.setattr(nfs_mount_facts, "mount_facts", lambda path: facts(case, path))
    with patch_module_args(args), pytest.raises(SystemExit):
        nfs_mount_facts.main()
    return json.loads(capsys.readouterr().out)


def test_module_reports_rdma_unchanged_in_check_mode(monkeypatch, capsys):
    out = run_module(
        monkeypatch, capsys, {"_ansible_check_mode": True, "path": MNT, "port": 20049, "vers": "4.2"}, "rdma"
    )
    assert out["changed"] is False and "failed" not in out
    assert out["ansible_facts"]["kvtier_nfs_mount"]["xprt"] == "rdma"
    assert out["problems"] == []


def test_rsize_and_wsize_below_the_wanted_transfer_are_named():
    f = facts("rdma")  # recorded against a VM whose nfsd allowed 256 KiB transfers
    assert nfs.problems(f, port=20049, vers="4.2", io_size=262144) == []
    f["options"].update(wsize="1048576")
    assert nfs.problems(f, io_size=1048576) == [
        "/mnt/kvcache is mounted with rsize=262144, below 1048576 bytes: each chunk then takes several round trips. "
        "Remount it (umount /mnt/kvcache && mount /mnt/kvcache); if it stays lower, the server caps it "
        "(/proc/fs/nfsd/max_block_size)"
    ]
