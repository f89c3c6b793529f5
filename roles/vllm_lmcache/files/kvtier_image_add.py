"""Add LMCache to a vLLM image: run inside the serving image's build (the vllm_lmcache role's container route).

The venv (created with --system-site-packages) sees the image's own torch and vLLM; this script installs only
what the image lacks into it, never a second torch or vLLM that would shadow the image's builds:
- from a package index: the wanted packages, resolved with the image's packages pinned as constraints (pip fails
  with the conflict when LMCache needs another torch than the image has, instead of installing one);
- from a wheelhouse: the lock's packages the image has no distribution of, without resolving again (the lock is
  the resolution), as the venv route installs it.
Then it installs kvtier's NIXL progress hook, and judges: the image's vLLM must be the spec's version, `pip check`
must be clean on a GPU build (reported on the CPU build, which leaves CUDA packages out on purpose), and the
import check must pass. LMCache's wheel declares any torch but its CUDA ops link the one it was built with: where
they do not load against the image's torch, the build stops naming both and the fix, building LMCache from its
source against the image's torch and CUDA toolkit (settings' lmcache_from_source; from a package index only).

Usage: python kvtier_image_add.py SETTINGS.json   (written by the role; see main())
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict:
    """{normalized name: version} of every distribution this interpreter sees (the image's and the venv's)."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)
    return found


def parse_pins(lines) -> dict:
    """{normalized name: the whole requirement line} from `name==version [--hash=...]` lines (comments and blanks
    skipped). The role's filter writes them on the controller; this script runs inside the image, on its Python's
    standard library."""
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, _ = line.partition("==")
        if not sep:
            raise ValueError(f"{line!r} is not name==version")
        pins[normalize(name)] = line
    return pins


def from_wheelhouse(lock: dict, present: dict) -> list:
    """The lock's requirement lines (with their hashes) of the packages the image has no distribution of (by name:
    the image's own builds are kept)."""
    return [line for name, line in sorted(lock.items()) if name not in present]


def constraints(present: dict) -> list:
    """The image's packages pinned at the versions it has."""
    return [f"{name}=={version}" for name, version in sorted(present.items())]


def base_version(version: str) -> str:
    """0.11.0+nv25.11 -> 0.11.0; NVIDIA's and the CPU builds carry a local version label."""
    return version.split("+", 1)[0]


def cuda_ops_mismatch(stderr: str, torch_version: str | None) -> str | None:
    """The refusal when LMCache's CUDA ops do not load against the image's torch; None for any other failure."""
    if "cuda_ops" not in stderr and "undefined symbol" not in stderr:
        return None
    last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
    return (
        f"kvtier: LMCache's CUDA ops do not load against the image's torch {torch_version or '(none)'} ({last}): "
        "its wheel was built against another torch. Set vllm_lmcache_container_lmcache_from_source: true (with "
        "vllm_lmcache_install_source: index) to build LMCache against the image's torch and CUDA toolkit, or choose "
        "an image whose torch matches LMCache's wheel"
    )


def pip(*args) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--no-input"], check=True)


def main(path: str) -> int:
    with open(path) as fh:
        s = json.load(fh)
    present = installed()
    vllm_found = present.get(normalize(s["vllm_package"]))
    if vllm_found is None or base_version(vllm_found) != s["vllm_version"]:
        print(
            f"kvtier: the image carries {s['vllm_package']} {vllm_found or '(none)'}, "
            f"the spec says {s['vllm_version']}: "
            "set kvtier_cluster.install.vllm_version to the image's (it is part of the cluster fingerprint) "
            "or choose an image with that vLLM",
            file=sys.stderr,
        )
        return 2
    work = os.path.dirname(os.path.abspath(path))
    if s["source"] == "wheelhouse":
        with open(s["lock"]) as fh:
            wanted = from_wheelhouse(parse_pins(fh), present)
        print(f"kvtier: adding {len(wanted)} packages from the wheelhouse: {' '.join(w.split()[0] for w in wanted)}")
        if wanted:
            requirements = os.path.join(os.path.dirname(os.path.abspath(path)), "wanted.txt")
            with open(requirements, "w") as fh:
                fh.write("\n".join(wanted) + "\n")
            pip(
                "install",
                "--no-index",
                "--no-deps",
                "--require-hashes",
                "--find-links",
                s["wheels"],
                "-r",
                requirements,
            )
    else:
        pinned = os.path.join(work, "image-constraints.txt")
        with open(pinned, "w") as fh:
            fh.write("\n".join(constraints(present)) + "\n")
        print(f"kvtier: adding {' '.join(s['requirements'])} with the image's {len(present)} packages pinned")
        # From source, LMCache's CUDA ops compile against the torch the image has (no isolated build environment).
        source = ["--no-binary", "lmcache", "--no-build-isolation"] if s.get("lmcache_from_source") else []
        pip("install", "-c", pinned, *source, *s["extra_args"], *s["requirements"])
    site = sysconfig.get_paths()["purelib"]
    for name in s["hook_files"]:
        shutil.copy(os.path.join(work, name), os.path.join(site, name))
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True, text=True
    )
    problems = [
        line
        for line in check.stdout.splitlines()
        if line.strip()
        and not line.startswith("No broken requirements")
        and not any(f"requires {skip}," in normalize(line) for skip in map(normalize, s["left_out"]))
    ]
    if problems and not s["cpu_build"]:
        print("kvtier: pip check found an inconsistent image:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 3
    print(
        "kvtier: pip check: "
        + (
            "every declared dependency is installed"
            if not problems
            else "on the CPU build also reports (kept): " + "; ".join(problems)
        )
    )
    imported = subprocess.run([sys.executable, "-c", s["import_check"]], capture_output=True, text=True)
    if imported.returncode != 0:
        sys.stderr.write(imported.stderr)
        refusal = None if s["cpu_build"] else cuda_ops_mismatch(imported.stderr, present.get("torch"))
        print(refusal or "kvtier: the import check failed (above)", file=sys.stderr)
        return 4
    print(f"kvtier: {s['vllm_package']} {vllm_found} and lmcache import in {sys.prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
