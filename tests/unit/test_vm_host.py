"""kvtier.vm.host lifecycle against a stand-in for qemu-system-x86_64 (no VM is booted here).

The stand-in speaks enough of the HMP monitor (banner, prompt, info pci, device_del, quit) to check
what matters across processes: QEMU outlives the process that started it, another process finds it
by name and destroys it, and the files go away.
"""

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kvtier.vm import host, image

PR_SET_CHILD_SUBREAPER = 36
FAKE_QEMU = textwrap.dedent(
    r"""
    #!PYTHON
    import os, re, socket, sys
    args = sys.argv[1:]
    if os.environ.get("FAKE_QEMU_FAIL"):
        sys.exit("qemu-system-x86_64: Could not set up host forwarding rule 'tcp:127.0.0.1:22-:22'")
    mon = next(a for a in args if a.startswith("unix:")).split(":", 1)[1].split(",")[0]
    devices = re.findall(r"nvme,id=(nvme\d+)", " ".join(args))
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(mon)
    srv.listen(1)
    while True:
        conn, _ = srv.accept()
        conn.sendall(b"QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) ")
        buf = b""
        while True:
            data = conn.recv(4096)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode().strip()
                echo = cmd.encode() + b"\r\n"
                if cmd == "quit":
                    conn.close()
                    sys.exit(0)
                if cmd.startswith("device_del "):
                    devices.remove(cmd.split()[1])
                    out = b""
                elif cmd == "info pci":
                    out = b"".join(b'    id "%s"\r\n' % d.encode() for d in devices)
                else:
                    out = b"unknown command\r\n"
                conn.sendall(b"\x1b[K" + echo + out + b"(qemu) ")
    """
).replace("PYTHON", sys.executable)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fake image, a fake qemu-system-x86_64 first on PATH, and a private state root."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "qemu-system-x86_64"
    fake.write_text(FAKE_QEMU.lstrip())
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("KVTIER_VM_STATE", str(tmp_path / "vms"))
    img = image.Image(str(tmp_path / "img"))
    os.makedirs(img.dir)
    for f in (img.kernel, img.initrd, img.key):
        open(f, "w").close()
    with open(img.base, "wb") as fh:
        fh.truncate(1024 * 1024)
    with open(os.path.join(img.dir, "recipe.json"), "w") as fh:
        fh.write("{}")
    yield img
    for vm in host.VM.all():  # a failed test must not leave stand-ins running
        vm.destroy()


@pytest.fixture
def subreaper():
    """Adopt orphans (as PID 1 would), so destroy() can reap the stand-in instead of leaving a zombie."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_qemu_outlives_its_starter_and_another_process_destroys_it(env, subreaper):
    starter = (
        "import json, sys; from kvtier.vm import host, image; "
        f"vm = host.VM('a').create(host.default_serials(3), img=image.Image({env.dir!r}), ssh_port=2299); "
        "print(json.dumps(vm.instance_config()))"
    )
    out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True, env=os.environ)
    cfg = json.loads(out.stdout)
    assert cfg == {"instance": "a", "address": "127.0.0.1", "user": "root", "port": 2299, "identity_file": env.key}

    vm = host.VM("a")  # this process did not start it
    assert vm.running()
    st = vm.state
    assert [d["serial"] for d in st["drives"]] == ["KVT0000001", "KVT0000002", "KVT0000003"]
    assert os.path.getsize(st["drives"][0]["file"]) == 2 * 1024**3
    assert os.stat(st["drives"][0]["file"]).st_blocks == 0  # sparse
    assert "root=/dev/vda rw console=ttyS0 systemd.hostname=a nvme_core.io_timeout=5" in st["argv"]
    pid = st["pid"]

    vm.unplug("KVT0000002")
    assert [d["plugged"] for d in host.VM("a").state["drives"]] == [True, False, True]
    with pytest.raises(host.VMError, match="no plugged NVMe drive with serial KVT0000002"):
        vm.unplug("KVT0000002")

    vm.destroy()
    assert not os.path.exists(vm.dir)
    assert not os.path.exists(f"/proc/{pid}")  # quit, and reaped by us as its adoptive parent
    vm.destroy()  # twice is fine


def test_two_vms_get_their_own_dirs_ports_and_macs(env):
    a = host.VM("a").create(["S1"], img=env)
    b = host.VM("b").create(["S1"], img=env)
    try:
        assert a.dir != b.dir and a.ssh_port != b.ssh_port
        assert [vm.name for vm in host.VM.all()] == ["a", "b"]
        assert host.mac_for("a") != host.mac_for("b")
        with pytest.raises(host.VMError, match="already exists"):
            host.VM("a").create(["S1"], img=env)
    finally:
        a.destroy()
        b.destroy()
    assert host.VM.all() == []


def test_a_qemu_that_exits_at_once_is_reported_and_cleaned_up(env, monkeypatch):
    monkeypatch.setenv("FAKE_QEMU_FAIL", "1")
    with pytest.raises(host.VMError, match="Could not set up host forwarding"):
        host.VM("c").create(["S1"], img=env, ssh_port=22)
    assert not os.path.exists(host.VM("c").dir)


def test_unbuilt_image_and_bad_arguments_are_refused(env, tmp_path):
    with pytest.raises(host.VMError, match="kvtier vm build"):
        host.VM("d").create(["S1"], img=image.Image(str(tmp_path / "nothing")))
    with pytest.raises(host.VMError, match="distinct"):
        host.VM("d").create(["S1", "S1"], img=env)
    with pytest.raises(host.VMError, match="bad VM name"):
        host.VM("../x")


def test_helpers():
    assert host.default_serials(2) == ["KVT0000001", "KVT0000002"]
    assert host.parse_size("2G") == 2 * 1024**3 and host.parse_size("512M") == 512 * 1024**2
    with pytest.raises(ValueError):
        host.parse_size("lots")
    assert host.data_nic_args("listen", 10001, "52:54:00:ab:cd:01") == [
        "-netdev",
        "socket,id=data0,listen=127.0.0.1:10001",
        "-device",
        "virtio-net-pci,netdev=data0,mac=52:54:00:ab:cd:01,addr=0x10",
    ]


def test_recipe_hash_follows_the_recipe():
    same = dict(image.RECIPE)
    assert image.recipe_hash(same) == image.recipe_hash()
    more = dict(image.RECIPE, packages=image.RECIPE["packages"] + ["lvm2"])
    assert image.recipe_hash(more) != image.recipe_hash()
