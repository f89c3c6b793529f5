"""One throw-away QEMU/TCG VM: a qcow2 overlay over the cached image, N sparse NVMe drives, SSH by hostfwd.

Everything about a running VM is in its state directory (``vm.json``, overlay, drive files, monitor
socket, console and QEMU logs), so the process that destroys it need not be the one that created it:
`molecule create` and `molecule destroy` are separate runs. QEMU runs as a child in its own session
(never -daemonize: a daemonized QEMU was left <defunct> under PID 1 on the test host) and outlives its
parent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

from kvtier.vm import image as vm_image

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
SSH_OPTS = (
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=10",
)
_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")


class VMError(RuntimeError):
    pass


def state_root() -> str:
    return os.environ.get("KVTIER_VM_STATE") or os.path.expanduser("~/.cache/kvtier/vms")


def default_serials(count: int, prefix: str = "KVT") -> list[str]:
    """KVT0000001, KVT0000002, ...: fixed-width like real serials, and sortable."""
    return [f"{prefix}{i:07d}" for i in range(1, count + 1)]


def parse_size(text: str | int) -> int:
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", text.strip(), re.I)
    if not m:
        raise ValueError(f"bad size {text!r}: use e.g. 2G or 512M")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data_nic_args(mode: str, port: int, mac: str, addr: int = 0x10) -> list[str]:
    """A second NIC joined to another VM's by a QEMU socket link: `listen` on one VM, `connect` on the other.

    The guest sees it as ens16 (PCI slot 0x10); it is left unconfigured.
    """
    if mode not in ("listen", "connect"):
        raise ValueError("mode is listen or connect")
    return [
        "-netdev",
        f"socket,id=data0,{mode}=127.0.0.1:{port}",
        "-device",
        f"virtio-net-pci,netdev=data0,mac={mac},addr={addr:#x}",
    ]


def tap_nic_args(ifname: str, mac: str, addr: int = 0x10) -> list[str]:
    """A second NIC on a host tap device (which the caller plugs into a bridge); the guest sees ens16."""
    return [
        "-netdev",
        f"tap,id=data0,ifname={ifname},script=no,downscript=no",
        "-device",
        f"virtio-net-pci,netdev=data0,mac={mac},addr={addr:#x}",
    ]


def mac_for(name: str) -> str:
    # Locally administered QEMU prefix + 3 bytes of the name: stable and distinct per VM.
    h = hashlib.sha256(name.encode()).hexdigest()
    return "52:54:00:" + ":".join(h[i : i + 2] for i in (0, 2, 4))


class VM:
    def __init__(self, name: str, root: str | None = None):
        if not NAME_RE.match(name):
            raise VMError(f"bad VM name {name!r}: letters, digits, '.', '_' and '-' only")
        self.name = name
        self.dir = os.path.join(root or state_root(), name)
        self._proc: subprocess.Popen | None = None

    # -- state ---------------------------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def state(self) -> dict:
        try:
            with open(self._path("vm.json")) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return {}

    def _save(self, state: dict) -> None:
        tmp = self._path("vm.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(state, fh, indent=1)
        os.replace(tmp, self._path("vm.json"))

    @property
    def exists(self) -> bool:
        return bool(self.state)

    @property
    def ssh_port(self) -> int:
        return self.state["ssh_port"]

    def instance_config(self) -> dict:
        """The entry molecule's delegated driver expects in instance_config.yml."""
        st = self.state
        return {
            "instance": self.name,
            "address": "127.0.0.1",
            "user": "root",
            "port": st["ssh_port"],
            "identity_file": st["ssh_key"],
        }

    def running(self) -> bool:
        """True while our QEMU runs. Checks the command line too, so a reused PID is never taken for it."""
        pid = self.state.get("pid")
        if not pid:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return False
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                return (self.dir + "/").encode() in fh.read()
        except (FileNotFoundError, IndexError):
            return False

    # -- lifecycle -----------------------------------------------------------------------------------
    def create(
        self,
        serials: list[str],
        *,
        img: vm_image.Image | None = None,
        drive_size: str | int = "2G",
        ssh_port: int | None = None,
        mem_mb: int = 2048,
        smp: int = 2,
        hostname: str | None = None,
        extra_args: list[str] | tuple = (),
        drive_opts: str = "",
        nice: int = 0,
    ) -> VM:
        """Create the disks and start QEMU; returns at once (see wait_ssh). Fails if the VM exists. A negative `nice`
        gives QEMU (and every thread it starts) that much more of a busy host's CPU, where root may raise it."""
        img = img or vm_image.current()
        if not img.complete:
            raise VMError(f"no VM image at {img.dir}: run `kvtier vm build` first")
        if self.exists:
            raise VMError(f"VM {self.name} already exists in {self.dir}: `kvtier vm down {self.name}` first")
        shutil.rmtree(self.dir, ignore_errors=True)  # left over from a create that died before saving state
        if len(set(serials)) != len(serials):
            raise VMError(f"NVMe serials must be distinct: {serials}")
        os.makedirs(self.dir)
        try:
            return self._start(
                img,
                serials,
                parse_size(drive_size),
                ssh_port,
                mem_mb,
                smp,
                hostname or self.name,
                list(extra_args),
                drive_opts,
                nice,
            )
        except BaseException:
            self.destroy()
            raise

    def _start(self, img, serials, size, ssh_port, mem_mb, smp, hostname, extra_args, drive_opts, nice=0) -> VM:
        port = ssh_port or free_port()
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", img.base, self._path("root.qcow2")],
            check=True,
        )
        drives, nvme_args = [], []
        for i, serial in enumerate(serials):
            path = self._path(f"nvme{i}.img")
            with open(path, "wb") as fh:
                fh.truncate(size)  # sparse: 8 x 2 GiB costs nothing until written
            opts = f",{drive_opts}" if drive_opts else ""
            nvme_args += [
                "-drive",
                f"file={path},if=none,id=nvd{i},format=raw,cache=unsafe,discard=unmap",
                "-device",
                f"nvme,id=nvme{i},serial={serial},drive=nvd{i}{opts}",
            ]
            drives.append({"serial": serial, "id": f"nvme{i}", "file": path, "plugged": True})
        argv = [
            "qemu-system-x86_64",
            "-name",
            self.name,
            "-nodefaults",
            "-no-user-config",
            "-vga",
            "none",
            "-display",
            "none",
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "max",
            "-m",
            str(mem_mb),
            "-smp",
            str(smp),
            "-serial",
            "file:" + self._path("console.log"),
            "-monitor",
            "unix:" + self._path("mon.sock") + ",server=on,wait=off",
            "-kernel",
            img.kernel,
            "-initrd",
            img.initrd,
            "-append",
            # QEMU 7.2's NVMe emulation under TCG now and then misses a submission made through the shadow doorbells
            # (the guest's driver uses them); the driver gets it back by a timeout, an abort and a controller reset,
            # after two io_timeouts: 5 s each instead of 30 keeps that a short stall, not a minute per lost command.
            f"root=/dev/vda rw console=ttyS0 systemd.hostname={hostname} nvme_core.io_timeout=5",
            "-drive",
            "file=" + self._path("root.qcow2") + ",if=virtio,format=qcow2,cache=unsafe",
            # The user-net NIC is pinned to slot 3 so the guest always calls it ens3 (the image's DHCP match).
            "-netdev",
            f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
            "-device",
            f"virtio-net-pci,netdev=n0,mac={mac_for(self.name)},addr=0x3",
            *nvme_args,
            *extra_args,
        ]
        # coreutils' nice runs QEMU at the new niceness, or as it is where that is not allowed.
        launch = ["nice", "-n", str(nice), *argv] if nice else argv
        with open(self._path("qemu.log"), "ab") as log:
            self._proc = subprocess.Popen(
                launch, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._save(
            {
                "name": self.name,
                "pid": self._proc.pid,
                "ssh_port": port,
                "ssh_key": img.key,
                "image": img.dir,
                "hostname": hostname,
                "monitor": self._path("mon.sock"),
                "drives": drives,
                "argv": argv,
                "started": time.time(),
            }
        )
        # QEMU creates the monitor socket once its devices are set up; a taken port makes it exit before.
        deadline = time.monotonic() + 30
        while not os.path.exists(self._path("mon.sock")):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise VMError(f"QEMU for {self.name} did not start: {self.log_tail()}")
            time.sleep(0.05)
        return self

    def log_tail(self, name: str = "qemu.log", lines: int = 20) -> str:
        try:
            with open(self._path(name), errors="replace") as fh:
                return "".join(fh.readlines()[-lines:]).strip()
        except FileNotFoundError:
            return ""

    def ssh_argv(self, *command: str) -> list[str]:
        st = self.state
        return ["ssh", "-i", st["ssh_key"], *SSH_OPTS, "-p", str(st["ssh_port"]), "root@127.0.0.1", *command]

    def ssh(self, command: str, *, check: bool = True, input: str | None = None, timeout: float = 600):
        """Run a shell command in the guest; returns the CompletedProcess (text, captured)."""
        proc = subprocess.run(
            self.ssh_argv(command), input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise VMError(f"{self.name}: `{command}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def wait_ssh(self, timeout: float = 600) -> float:
        """Wait until root can log in; returns seconds since QEMU started."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise VMError(f"QEMU for {self.name} exited during boot: {self.log_tail()}")
            try:
                if self.ssh("true", check=False, timeout=30).returncode == 0:
                    return time.time() - self.state["started"]
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise VMError(f"{self.name}: no SSH after {timeout:.0f} s; console: {self.log_tail('console.log')}")
            time.sleep(1)

    # -- monitor -------------------------------------------------------------------------------------
    def monitor(self, command: str, timeout: float = 10) -> str:
        """Run one HMP command and return its output (the echo and terminal codes removed)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(self._path("mon.sock"))
            _read_until(s, b"(qemu) ")
            s.sendall(command.encode() + b"\n")
            if command.strip() == "quit":
                # Closing before EOF sometimes leaves QEMU running (notes/qemu-testbed.md, caveat 3).
                return _read_until(s, None).decode(errors="replace")
            out = _read_until(s, b"(qemu) ")
        text = _ANSI.sub(b"", out).decode(errors="replace").replace("\r", "")
        lines = text.split("\n")[1:]  # the first line is the echoed command
        return "\n".join(line for line in lines if line != "(qemu) ").strip()

    def unplug(self, serial: str, timeout: float = 60) -> None:
        """Hot-unplug the NVMe drive with this serial (as if it died) and wait until the guest let go."""
        st = self.state
        drive = next((d for d in st.get("drives", []) if d["serial"] == serial), None)
        if drive is None or not drive["plugged"]:
            raise VMError(f"{self.name} has no plugged NVMe drive with serial {serial}")
        out = self.monitor(f"device_del {drive['id']}")
        if out:
            raise VMError(f"device_del {drive['id']} failed: {out}")
        # device_del only asks; the guest acknowledges the ACPI eject and then the device is gone.
        deadline = time.monotonic() + timeout
        while f'id "{drive["id"]}"' in self.monitor("info pci"):
            if time.monotonic() > deadline:
                raise VMError(f"{self.name}: guest did not release {drive['id']} within {timeout:.0f} s")
            time.sleep(0.5)
        drive["plugged"] = False
        self._save(st)

    def destroy(self, timeout: float = 10) -> None:
        """Stop QEMU (monitor quit, then SIGKILL) and delete the state directory. Safe to call twice."""
        pid = self.state.get("pid")
        if self.running():
            try:
                self.monitor("quit", timeout=timeout)
            except (OSError, VMError):
                pass
            deadline = time.monotonic() + timeout
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.running():
                os.kill(pid, signal.SIGKILL)
                while self.running():
                    time.sleep(0.05)
        if self._proc is not None:
            self._proc.wait()
        elif pid:
            _reap_if_ours(pid, timeout)
        shutil.rmtree(self.dir, ignore_errors=True)

    @classmethod
    def all(cls, root: str | None = None) -> list[VM]:
        root = root or state_root()
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        return [cls(n, root) for n in names if os.path.exists(os.path.join(root, n, "vm.json"))]


def _reap_if_ours(pid: int, timeout: float) -> None:
    """Reap pid if this process is its parent (or subreaper); otherwise its parent or init does.

    running() is already False while the kernel tears the process down (its cmdline reads empty before
    it turns zombie), so a single non-blocking wait can come too early and leave a zombie behind.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _read_until(s: socket.socket, marker: bytes | None) -> bytes:
    buf = b""
    while marker is None or marker not in buf:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            if marker is None:
                break
            raise
        if not chunk:
            if marker is None:
                break
            raise VMError("QEMU monitor closed the connection")
        buf += chunk
    return buf
