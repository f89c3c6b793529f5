"""Systemd base images for the container test hosts, built offline from Debian packages.

No container registry is reachable from the machines kvtier is tested on, so the images are built with
mmdebstrap from the Debian mirror and imported into podman. Each image carries a label with the hash of
its recipe; it is rebuilt only when the recipe changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import tempfile

MIRROR = os.environ.get("KVTIER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
RECIPE_LABEL = "org.kvtier.recipe"

# What Ansible and systemd need in a test host; everything else is the roles' job to install.
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-apt",
    "iproute2",
    "procps",
    "ca-certificates",
)


@dataclasses.dataclass(frozen=True)
class ImageRecipe:
    name: str  # podman reference, e.g. localhost/kvtier-debian:12
    suite: str  # Debian suite passed to mmdebstrap
    packages: tuple[str, ...] = BASE_PACKAGES

    @property
    def digest(self) -> str:
        recipe = {"suite": self.suite, "packages": sorted(self.packages), "mirror": MIRROR, "v": 2}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


RECIPES = {
    "debian12": ImageRecipe("localhost/kvtier-debian:12", "bookworm"),
    "debian13": ImageRecipe("localhost/kvtier-debian:13", "trixie"),
    # The lab's Sparks are reached over SSH, as real Sparks are (and with pipelining: a task is one round trip), by an
    # unprivileged login user with sudo (kvtier/lab/sparks.py creates it).
    # fio: the storage bench installs it on a real Spark; in the lab that download and unpack cost ~70 s of every
    # run, and the bench's install task still runs (and finds it).
    # nftables: the firewall role installs it on a real host; here the download would cost every lab run.
    # podman: the lab runs one Spark on the container route (kvtier/lab/standin.py), with its own podman inside. crun,
    # not runc: nested in a container on the cgroup v1 host, runc cannot mount the new container's cgroup (it looks
    # for the container's cgroup path from the host's root); crun with --cgroupns=host can.
    "spark": ImageRecipe(
        "localhost/kvtier-spark:12",
        "bookworm",
        BASE_PACKAGES
        + ("openssh-server", "sudo", "nftables", "fio", "podman", "crun", "uidmap", "fuse-overlayfs", "slirp4netns"),
    ),
    # The lab's operations host (kvtier/lab/operator_install.py): an operator's machine that Ansible also manages (its
    # Prometheus, node_exporter, firewall), reached over SSH like every node. None of the lab's own packages.
    "ops": ImageRecipe("localhost/kvtier-ops:12", "bookworm", BASE_PACKAGES + ("openssh-server", "sudo", "nftables")),
}


def current_digest(recipe: ImageRecipe) -> str | None:
    """The recipe label of the image podman holds now, or None when there is no such image."""
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", '{{ index .Labels "%s" }}' % RECIPE_LABEL, recipe.name],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def build(recipe: ImageRecipe, *, force: bool = False, log=print) -> bool:
    """Build and import one image unless an image with the same recipe exists. Returns True if built."""
    if not force and current_digest(recipe) == recipe.digest:
        log(f"{recipe.name}: up to date (recipe {recipe.digest})")
        return False
    log(f"{recipe.name}: building {recipe.suite} rootfs with mmdebstrap (recipe {recipe.digest})")
    with tempfile.TemporaryDirectory(prefix="kvtier-image-") as tmp:
        tarball = os.path.join(tmp, "rootfs.tar")
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                # Keep the package lists, as a real host has them: check mode cannot refresh them.
                "--skip=cleanup/apt/lists",
                "--include=" + ",".join(recipe.packages),
                recipe.suite,
                tarball,
                MIRROR,
            ],
            check=True,
        )
        subprocess.run(
            [
                "podman",
                "import",
                "--change",
                f"LABEL {RECIPE_LABEL}={recipe.digest}",
                "--change",
                'CMD ["/sbin/init"]',
                tarball,
                recipe.name,
            ],
            check=True,
            capture_output=True,  # podman prints per-blob progress; keep the log readable
        )
    log(f"{recipe.name}: imported")
    return True
