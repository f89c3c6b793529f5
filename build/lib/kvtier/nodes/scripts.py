"""Probe scripts shipped to a node, each probe module as a module of its own, never pasted into another.

A node runs a script on its python3 from stdin (kvtier.nodes.transport). The script rebuilds every probe module
from its source text in a namespace of its own, so a private helper (`_unescape`, say) stays its module's, then
makes the probes' public names visible to the caller's expression. A public name two probes both define would
make the expression's meaning depend on their order: `script()` refuses it.
"""

from __future__ import annotations

import ast
import inspect

# Runs first on the node: the function that turns one probe's source text into a module.
_LOADER = """import sys as _sys
import types as _types


def _kvtier_module(name, text):
    module = _types.ModuleType(name)
    _sys.modules[name] = module  # dataclasses look their module up there
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


def script(*modules) -> str:
    """The script that ships `modules` (kvtier.probes.*) to a node; ScriptError when two define one public name."""
    owner: dict[str, str] = {}
    calls = []
    for module in modules:
        text = inspect.getsource(module)
        for name in dict.fromkeys(defined_names(text)):
            if name.startswith("_"):
                continue
            if name in owner:
                raise ScriptError(f"{name} is defined by both {owner[name]} and {module.__name__}: rename one")
            owner[name] = module.__name__
        calls.append(f"_kvtier_module({module_name(module)!r}, {text!r})")
    return _LOADER + "\n".join(calls) + "\n"
