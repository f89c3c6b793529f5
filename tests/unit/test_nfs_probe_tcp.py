"""nfs_mount_facts against a TCP mount recorded in the QEMU VM (tests/fixtures/nfs/tcp, see record.sh):
the rxe link deleted and the share mounted with proto=tcp at the nfs_client mount point.
"""

from kvtier.probes import nfs
from tests.unit.test_nfs_probe import MNT, facts, run_module


def test_tcp_mount_is_refused_with_what_to_fix():
    f = facts("tcp")
    assert (f["proto"], f["xprt"], f["rdma"]) == ("tcp", "tcp", False)
    assert len(f["xprts"][0]["counters"]) == len(nfs.XPRT_FIELDS["tcp"])
    assert nfs.problems(f, port=20049, vers="4.2") == [
        "/mnt/kvcache is an NFS mount over TCP, not RDMA (proto=tcp, xprt tcp): the mount fell back or was made "
        "without proto=rdma. Check on this host that the RDMA link on the data interface is ACTIVE (`rdma link show`) "
        "and that rpcrdma is loaded, and on the server that /proc/fs/nfsd/portlist lists 'rdma 20049'; then remount "
        "(umount /mnt/kvcache && mount /mnt/kvcache). Set nfs_client_allow_tcp: true only if TCP is acceptable here."
    ]


def test_tcp_mount_is_accepted_when_allowed():
    assert nfs.problems(facts("tcp"), allow_tcp=True, port=20049, vers="4.2") == []


def test_module_fails_on_tcp_with_the_probe_message(monkeypatch, capsys):
    out = run_module(monkeypatch, capsys, {"path": MNT, "port": 20049}, "tcp")
    assert out["failed"] is True
    assert out["msg"].startswith("/mnt/kvcache is an NFS mount over TCP, not RDMA")
    assert out["ansible_facts"]["kvtier_nfs_mount"]["proto"] == "tcp"


def test_module_warns_when_tcp_is_allowed(monkeypatch, capsys):
    import nfs_mount_facts

    # Capture the warning itself: ansible-core de-duplicates warnings within one process.
    warned = []
    monkeypatch.setattr(nfs_mount_facts.AnsibleModule, "warn", lambda self, msg: warned.append(msg))
    out = run_module(monkeypatch, capsys, {"path": MNT, "allow_tcp": True}, "tcp")
    assert "failed" not in out
    assert warned == ["/mnt/kvcache runs over tcp, accepted because allow_tcp is set"]
