"""Probe scripts shipped to a node, each probe module as a module of its own, never pasted into another.

A node runs a script on its python3 from stdin (kvtier.nodes.transport). The script rebuilds every probe module
from its source text in a namespace of its own, so a private helper (`_unescape`, say) stays its module's, then
makes the probes' public names visible to the caller's expression. A public name two probes both define would
make the expression's meaning depend on their order: `script()` refuses it.
"""

from __future__ import annotations

import ast
import importlib
import inspect

# Runs first on the node: the function that turns one probe's source text into a module. Each module is also known
# by its name in kvtier's package (kvtier.probes.<name>), so a probe's import of another shipped before it resolves.
_LOADER = """import sys as _sys
import types as _types


def _kvtier_module(name, dotted, text):
    for package in ("kvtier", "kvtier.probes"):
        if package not in _sys.modules:  # a node has no kvtier; where it is installed, its own modules stay
            _sys.modules[package] = _types.ModuleType(package)
            _sys.modules[package].__path__ = []
    module = _types.ModuleType(dotted)
    _sys.modules[name] = module  # dataclasses look their module up there
    _sys.modules.setdefault(dotted, module)
    exec(compile(text, name + ".py", "exec"), module.__dict__)
    globals().update((key, value) for key, value in vars(module).items() if not key.startswith("_"))
"""


class ScriptError(ValueError):
    """Probe modules that cannot travel together; the message names the name and the modules."""


def defined_names(text: str) -> list[str]:
    """The names a module's top-level statements define (functions, classes, assignments), once per definition."""
    names = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            if not isinstance(node, ast.AugAssign):
                names.append(node.target.id)
    return names


def module_name(module) -> str:
    """The name a probe module has on the node (kvtier.probes.nfs -> kvtier_probe_nfs)."""
    return "kvtier_probe_" + module.__name__.rsplit(".", 1)[-1]


def probe_imports(module) -> list:
    """The kvtier.probes modules `module` imports (as kvtier's package names them), in the order it imports them."""
    found = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvtier.probes."):
            found.append(importlib.import_module(node.module))
    return list(dict.fromkeys(found))


def with_imports(modules) -> list:
    """`modules` with every kvtier.probes module they import before them, each once."""
    ordered: list = []

    def add(module) -> None:
        if module in ordered:
            return
        for dependency in probe_imports(module):
            add(dependency)
        ordered.append(module)

    for module in modules:
        add(module)
    return ordered


def script(*modules) -> str:
    """The script that ships `modules` (kvtier.probes.*), and the probe modules they import, to a node; ScriptError
    when two define one public name."""
    owner: dict[str, str] = {}
    calls = []
    for module in with_imports(modules):
        text = inspect.getsource(module)
        for name in dict.fromkeys(defined_names(text)):
            if name.startswith("_"):
                continue
            if name in owner:
                raise ScriptError(f"{name} is defined by both {owner[name]} and {module.__name__}: rename one")
            owner[name] = module.__name__
        calls.append(f"_kvtier_module({module_name(module)!r}, {module.__name__!r}, {text!r})")
    return _LOADER + "\n".join(calls) + "\n"
