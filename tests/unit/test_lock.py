"""The controller's lock: bootstrap installs requirements.in resolved, every file hashed (--require-hashes)."""

import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[2]
ENTRY = re.compile(r"^([A-Za-z0-9._\[\],-]+)==(\S+)((?:\s*\\\n\s*--hash=sha256:[0-9a-f]{64})*)", re.M)


def _locked() -> dict:
    text = (REPO / "requirements.lock").read_text()
    return {
        canonicalize_name(m[1].split("[")[0]): (m[2], re.findall(r"sha256:([0-9a-f]{64})", m[3]))
        for m in ENTRY.finditer(text)
    }


def _direct() -> dict:
    pins = {}
    for line in (REPO / "requirements.in").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = str(req.specifier).removeprefix("==")
    return pins


def test_every_locked_file_has_its_sha256():
    locked = _locked()
    unhashed = sorted(name for name, (_, hashes) in locked.items() if not hashes)
    assert len(locked) > 50 and not unhashed


def test_the_lock_is_requirements_in_resolved():
    """Editing requirements.in without `make lock` leaves a direct pin the lock does not carry."""
    locked = _locked()
    assert {name: locked.get(name, (None,))[0] for name in _direct()} == _direct()


def test_the_locked_versions_satisfy_the_package_ranges():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = project["dependencies"] + project["optional-dependencies"]["test"]
    locked = _locked()
    outside = [r for r in map(Requirement, ranges) if locked[canonicalize_name(r.name)][0] not in r.specifier]
    assert outside == []
