"""The probe scripts shipped to nodes: every probe a module of its own, no name defined twice."""

from __future__ import annotations

import ast
import collections
import importlib
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import kvtier
from kvtier.nodes import scripts, transport


def _shipped_scripts() -> dict:
    """Every script kvtier ships, found as module-level strings built by scripts.script()."""
    found = {}
    for info in pkgutil.walk_packages(kvtier.__path__, "kvtier."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, str) and value.startswith(scripts._LOADER) and value != scripts._LOADER:
                found[f"{info.name}.{name}"] = value
    return found


def _modules_of(script: str) -> dict:
    """name -> source text of each probe module a script rebuilds on the node."""
    modules = {}
    for node in ast.parse(script).body:
        call = getattr(node, "value", None)
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "_kvtier_module":
            modules[call.args[0].value] = call.args[2].value
    return modules


SHIPPED = _shipped_scripts()


def test_the_scripts_are_found():
    assert {"kvtier.health.gather.SPARK_SOURCE", "kvtier.health.gather.STORAGE_SOURCE", "kvtier.warmup.SOURCE"} <= set(
        SHIPPED
    )


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_no_shipped_script_defines_a_name_twice(name):
    modules = _modules_of(SHIPPED[name])
    assert modules, f"{name} ships no probe module"
    public = collections.defaultdict(list)
    for module, text in modules.items():
        twice = [n for n, k in collections.Counter(scripts.defined_names(text)).items() if k > 1]
        assert not twice, f"{name}: {module} defines {twice} more than once"
        for defined in set(scripts.defined_names(text)):
            if not defined.startswith("_"):
                public[defined].append(module)
    shared = {n: m for n, m in public.items() if len(m) > 1}
    assert not shared, f"{name}: public names defined by more than one module: {shared}"


def test_a_probe_split_into_modules_runs_where_kvtier_is_not_installed():
    """The health checks are one module per tier importing each other: the script ships them in import order and
    resolves their imports on a Python with no kvtier (and no site-packages at all)."""
    from kvtier.health import gather

    shipped = list(_modules_of(gather.SPARK_SOURCE))
    assert (
        shipped.index("kvtier_probe_health_core")
        < shipped.index("kvtier_probe_health_l2")
        < shipped.index("kvtier_probe_health")
    )
    expression = '[c["check"] for c in spark_checks("s1", {"probe": {"lmcache_healthy": False}}, {})]'
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", gather.SPARK_SOURCE + f"\nprint({expression})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.strip() == "['lmcache', 'hit']"


def _probe_module(tmp_path, monkeypatch, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_each_module_keeps_its_private_helpers(tmp_path, monkeypatch):
    first = _probe_module(
        tmp_path, monkeypatch, "probe_first", "def _parse(v):\n    return 'first'\n\ndef a():\n    return _parse(0)\n"
    )
    second = _probe_module(
        tmp_path, monkeypatch, "probe_second", "def _parse(v):\n    return 'second'\n\ndef b():\n    return _parse(0)\n"
    )
    script = scripts.script(first, second)
    assert transport.local("here").python(script, "[a(), b()]") == ["first", "second"]


def test_a_public_name_two_modules_define_is_refused(tmp_path, monkeypatch):
    first = _probe_module(tmp_path, monkeypatch, "probe_one", "class ProbeError(Exception):\n    pass\n")
    second = _probe_module(tmp_path, monkeypatch, "probe_two", "import os\n\nclass ProbeError(Exception):\n    pass\n")
    with pytest.raises(scripts.ScriptError, match="ProbeError is defined by both probe_one and probe_two"):
        scripts.script(first, second)
    # An import (os) is not a definition: two modules may both import it.
    other = _probe_module(tmp_path, monkeypatch, "probe_three", "import os\n\nVALUE = 1\n")
    assert transport.local("here").python(scripts.script(second, other), "VALUE") == 1


def test_defined_names_lists_every_definition():
    text = "import os\nA = 1\nB: int = 2\nA += 1\nx, (y, z) = 1, (2, 3)\ndef f(): pass\nclass C: pass\ndef f(): pass\n"
    assert scripts.defined_names(text) == ["A", "B", "x", "y", "z", "f", "C", "f"]


SSH_HOST = {"ansible_host": "10.0.0.5", "ansible_user": "ops", "ansible_port": 2222, "ansible_become": True}


def test_an_ssh_node_is_reached_as_the_inventory_says():
    node = transport.from_hostvars("spark01", {**SSH_HOST, "ansible_ssh_common_args": "-o ProxyJump=bastion"})
    argv = node.argv("python3", "-")
    assert argv[:4] == ["ssh", "-o", "BatchMode=yes", "-o"] and "ProxyJump=bastion" in argv
    assert argv[-2:] == ["ops@10.0.0.5", "sudo -n python3 -"] and argv[argv.index("-p") + 1] == "2222"
    other = transport.from_hostvars("spark01", {**SSH_HOST, "ansible_become_user": "kvtier-svc"})
    assert other.argv("id")[-1] == "sudo -n -u kvtier-svc id"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"ansible_become_method": "su"}, "become root with sudo only"),
        ({"ansible_become_password": "secret"}, "never type a password"),
    ],
)
def test_a_become_the_probes_cannot_honour_is_refused(extra, message):
    with pytest.raises(transport.NodeError, match=message) as caught:
        transport.from_hostvars("spark01", {**SSH_HOST, **extra})
    assert "secret" not in str(caught.value)
