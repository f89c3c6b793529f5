"""Each default has one definition: the L2 endpoint's port and users live in the kv_store role's defaults only.

The Sparks' LMCache reaches L2 at the storage node's kvtier_data_address, kv_store_port and kv_store_lmcache_user
(kvtier.cluster.derive); a second definition of those defaults anywhere else is where drift starts.
"""

import pathlib
import re
import subprocess

import yaml

from kvtier.cluster import derive
from tests.unit._cluster_data import spec_dict

ROOT = pathlib.Path(__file__).resolve().parents[2]
KV_STORE_DEFAULTS = ROOT / "roles" / "kv_store" / "defaults" / "main.yml"
# The values kv_store defines, written where a default could hide: code, roles, playbooks, inventories.
L2_DEFAULTS = ("kv_store_port", "kv_store_lmcache_user", "kv_store_admin_user")


def _tracked():
    names = subprocess.run(
        ["git", "ls-files", "kvtier", "roles", "playbooks", "library", "inventory"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [n for n in names if n.endswith((".py", ".yml", ".yaml", ".j2"))]


def test_the_l2_defaults_are_defined_once():
    defaults = yaml.safe_load(KV_STORE_DEFAULTS.read_text())
    values = {str(defaults[name]) for name in L2_DEFAULTS}
    assert values == {"6379", "lmcache", "kvtier-admin"}
    patterns = {
        "6379": re.compile(r"\b6379\b"),
        # The user name, not the "lmcache" section or package: a user field or a default() set to it.
        "lmcache": re.compile(r"""(user\w*["']?\s*[:=,(]\s*|default\()["']?lmcache(?![\w-])"""),
        "kvtier-admin": re.compile(r"\bkvtier-admin\b"),
    }
    found = []
    for name in _tracked():
        if ROOT / name == KV_STORE_DEFAULTS:
            continue
        text = (ROOT / name).read_text(errors="replace")
        found += [f"{name}: {value}" for value, pattern in patterns.items() if pattern.search(text)]
    assert found == [], "a second definition of a kv_store default; derive it (kvtier.cluster.derive) instead"


def test_derive_reads_the_kv_store_defaults():
    assert derive.l2_endpoint({"kvtier_data_address": "10.10.0.10"}) == {
        "host": "10.10.0.10",
        "port": 6379,
        "user": "lmcache",
    }
    assert derive.storage_settings(None)["kv_store_admin_user"] == "kvtier-admin"


def test_the_spec_itself_has_no_l2_endpoint_default():
    from kvtier.cluster import validate

    data = spec_dict()
    for key in ("host", "port", "user"):
        del data["l2"][key]
    problems = " ".join(validate(data))
    assert "l2.host is required" in problems and "l2.port is required" in problems
    assert "l2 has no credentials: set l2.user" in problems


def test_argument_specs_carry_no_defaults():
    """A role's defaults/main.yml is the one place of its defaults; argument_specs describe type and choices."""
    found = []
    for spec in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        for entry, data in (yaml.safe_load(spec.read_text())["argument_specs"] or {}).items():
            found += [f"{spec.parts[-3]} {entry} {o}" for o, v in (data.get("options") or {}).items() if "default" in v]
    assert found == []


def test_the_password_policy_is_defined_once():
    """Preflight, kv_store, vllm_lmcache and rendering all call kvtier.passwords; no copy of its list may reappear."""
    copies = []
    for name in _tracked():
        text = (ROOT / name).read_text(errors="replace")
        if name != "kvtier/passwords.py" and ("change-me" in text.lower() or "min_length" in text):
            copies.append(name)
    assert copies == []
