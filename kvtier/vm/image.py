"""Build the Debian 12 VM base image once per recipe and cache it.

The image is a raw ext4 filesystem (no partition table, booted with root=/dev/vda) plus the kernel and
a small initrd taken out of it, and an SSH key pair whose public half is root's only way in. It lives
in ``<cache>/<recipe-hash>/``; changing anything that goes into the image changes the hash, so a stale
image is never reused and an unchanged one is never rebuilt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kvtier.images import MIRROR

SUITE = "bookworm"
IMAGE_SIZE = "3G"
# What the storage-node tests need inside the guest; see notes/qemu-testbed.md for why each is there.
PACKAGES = (
    "linux-image-amd64",
    "initramfs-tools",
    "systemd-sysv",
    "udev",
    "dbus",
    "openssh-server",
    "sudo",  # the lab's login user becomes root as on a real cluster (LOGIN_USER)
    "nftables",  # the firewall role's (it installs it on a real host)
    "python3",
    "python3-apt",  # Ansible's apt module needs it in check mode (it cannot install it then)
    "mdadm",
    "xfsprogs",
    "nvme-cli",
    "nfs-kernel-server",
    "nfs-common",
    "rdma-core",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    "iproute2",
    "netplan.io",  # the roce role's netplan path (scenario roce_netplan); with no /etc/netplan file it does nothing
    "iputils-ping",
    "procps",
    "kmod",
    "fio",
    "haproxy",  # the router role's front door on the storage node (the lab's router runs there)
    # The lab's L2 server (kv_store picks Redis on Debian 12). The role installs it on a real host; here a
    # download and unpack under TCG cost ~70 s of every lab run (kv_store_valkey tests the install itself).
    "redis-server",
    "redis-tools",
    # The monitoring exporters (node_exporter everywhere, the L2 server's): the roles install them on a real host.
    "prometheus-node-exporter",
    "prometheus-redis-exporter",
    "less",
    "pciutils",
    "util-linux",
)
# MODULES=list with just what mounts the root disk: a 7 MiB initrd instead of 36 MiB boots ~5 s faster.
INITRD_MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "ext4", "crc32c_generic")

# The lab's login user on every host (the example inventory's ansible_user): unprivileged, sudo without a password.
LOGIN_USER = "kvtier"

# Runs once inside mmdebstrap as a customize hook, $1 = the rootfs. @PUBKEY@ is filled in per build
# (the key is not part of the recipe).
CUSTOMIZE_HOOK = r"""#!/bin/sh
set -eu
R=$1
install -d -m 700 "$R/root/.ssh"
printf '%s\n' '@PUBKEY@' > "$R/root/.ssh/authorized_keys"
chmod 600 "$R/root/.ssh/authorized_keys"
# The lab's login user: the same key, sudo without a password, as an operator's account on a real node.
chroot "$R" useradd --create-home --shell /bin/bash @LOGIN_USER@
install -d -m 700 "$R/home/@LOGIN_USER@/.ssh"
printf '%s\n' '@PUBKEY@' > "$R/home/@LOGIN_USER@/.ssh/authorized_keys"
chmod 600 "$R/home/@LOGIN_USER@/.ssh/authorized_keys"
chroot "$R" chown -R @LOGIN_USER@: /home/@LOGIN_USER@/.ssh
printf '@LOGIN_USER@ ALL=(ALL) NOPASSWD: ALL\n' > "$R/etc/sudoers.d/@LOGIN_USER@"
chmod 440 "$R/etc/sudoers.d/@LOGIN_USER@"
echo kvtier-vm > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 kvtier-vm\n' > "$R/etc/hosts"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' > "$R/etc/fstab"
printf 'nameserver 10.0.2.3\n' > "$R/etc/resolv.conf"
# DHCP only on the user-net NIC (pinned to PCI slot 3); other NICs are the tests' to configure.
mkdir -p "$R/etc/systemd/network"
printf '[Match]\nName=ens3\n[Network]\nDHCP=ipv4\n[DHCPv4]\nUseDomains=no\n' > "$R/etc/systemd/network/50-dhcp.network"
chroot "$R" systemctl enable systemd-networkd ssh
# Servers the roles configure and enable themselves: not started at every boot of every test VM (under TCG each
# one costs boot time, and a server running with its packaged defaults is not what a test host should have).
chroot "$R" systemctl disable redis-server haproxy
# Housekeeping a test VM never needs, each seconds of guest CPU at every boot under TCG: e2scrub's LVM snapshot
# reaper (no LVM here), modules for devices QEMU does not give it (no display, no EFI, no FUSE), and the apt and
# man-db timers (a daily apt run holding the dpkg lock would stall a role's package task).
chroot "$R" systemctl mask e2scrub_reap.service e2scrub_all.timer modprobe@drm.service modprobe@efi_pstore.service \
  modprobe@fuse.service apt-daily.timer apt-daily-upgrade.timer man-db.timer dpkg-db-backup.timer
# Root logs in by key only.
printf 'PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n' \
  > "$R/etc/ssh/sshd_config.d/kvtier.conf"
printf 'MODULES=list\n' > "$R/etc/initramfs-tools/conf.d/kvtier-modules"
printf '%s\n' @INITRD_MODULES@ >> "$R/etc/initramfs-tools/modules"
chroot "$R" update-initramfs -u -k all
# QEMU boots the kernel and initrd taken out of the image (-kernel/-initrd), never the guest's /boot: a guest's
# update-initramfs (nvme_raid runs it for mdadm.conf) cannot change its boot and costs minutes under TCG.
sed -i 's/^update_initramfs=.*/update_initramfs=no/' "$R/etc/initramfs-tools/update-initramfs.conf"
"""

RECIPE = {
    "v": 1,
    "login_user": LOGIN_USER,
    "suite": SUITE,
    "mirror": MIRROR,
    "packages": sorted(PACKAGES),
    "initrd_modules": list(INITRD_MODULES),
    "hook": CUSTOMIZE_HOOK,
    "size": IMAGE_SIZE,
}


def recipe_hash(recipe: dict = RECIPE) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def cache_root() -> str:
    return os.environ.get("KVTIER_VM_CACHE") or os.path.expanduser("~/.cache/kvtier/vm")


@dataclasses.dataclass(frozen=True)
class Image:
    """A built image: the files a VM boots from and the key that logs in to it."""

    dir: str

    @property
    def base(self) -> str:
        return os.path.join(self.dir, "base.raw")

    @property
    def kernel(self) -> str:
        return os.path.join(self.dir, "vmlinuz")

    @property
    def initrd(self) -> str:
        return os.path.join(self.dir, "initrd.img")

    @property
    def key(self) -> str:
        return os.path.join(self.dir, "id_ed25519")

    @property
    def complete(self) -> bool:
        # recipe.json is written last, so its presence means the build finished.
        return os.path.exists(os.path.join(self.dir, "recipe.json"))


def current() -> Image:
    """The image for the current recipe (it may not be built yet: check `complete`)."""
    return Image(os.path.join(cache_root(), recipe_hash()))


@contextlib.contextmanager
def _lock(root: str):
    # Two `molecule create` runs at once must not both build.
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".build.lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build(force: bool = False, log=print) -> Image:
    """Return the cached image for the current recipe, building it first if needed (needs root)."""
    image = current()
    with _lock(cache_root()):
        if image.complete and not force:
            log(f"vm image {os.path.basename(image.dir)}: up to date ({image.dir})")
            return image
        start = time.monotonic()
        log(f"vm image {os.path.basename(image.dir)}: building {SUITE} with mmdebstrap from {MIRROR}")
        work = tempfile.mkdtemp(prefix=".build-", dir=cache_root())
        try:
            _build_into(work)
            shutil.rmtree(image.dir, ignore_errors=True)
            os.rename(work, image.dir)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        log(f"vm image {os.path.basename(image.dir)}: built in {time.monotonic() - start:.0f} s")
        return image


def _build_into(out: str) -> None:
    key = os.path.join(out, "id_ed25519")
    # Every tool's output goes to stderr: stdout carries `kvtier vm up|build`'s JSON, which molecule parses.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kvtier-vm", "-f", key], check=True, stdout=sys.stderr
    )
    with open(key + ".pub") as fh:
        pubkey = fh.read().strip()
    hook = os.path.join(out, "customize.sh")
    with open(hook, "w") as fh:
        fh.write(
            CUSTOMIZE_HOOK.replace("@PUBKEY@", pubkey)
            .replace("@INITRD_MODULES@", " ".join(INITRD_MODULES))
            .replace("@LOGIN_USER@", LOGIN_USER)
        )
    os.chmod(hook, 0o755)
    rootfs = os.path.join(out, "rootfs")
    try:
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--mode=root",
                "--variant=minbase",
                "--include=" + ",".join(PACKAGES),
                "--skip=cleanup/apt/lists",  # keep package lists, as a real host has them (check mode needs them)
                "--customize-hook=" + hook,
                SUITE,
                rootfs,
                MIRROR,
            ],
            check=True,
            stdout=sys.stderr,  # the customize hook's apt and update-initramfs print to stdout
        )
        # Exactly one kernel is installed; take it and its initrd out for -kernel/-initrd.
        for pattern, name in (("vmlinuz-*", "vmlinuz"), ("initrd.img-*", "initrd.img")):
            found = glob.glob(os.path.join(rootfs, "boot", pattern))
            if len(found) != 1:
                raise RuntimeError(f"expected one {pattern} in the rootfs, found {found}")
            shutil.copyfile(found[0], os.path.join(out, name))
        subprocess.run(
            ["mkfs.ext4", "-q", "-L", "kvtier-root", "-d", rootfs, os.path.join(out, "base.raw"), IMAGE_SIZE],
            check=True,
            stdout=sys.stderr,
        )
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
        os.unlink(hook)
    with open(os.path.join(out, "recipe.json"), "w") as fh:
        json.dump(RECIPE, fh, indent=1, sort_keys=True)
