"""Quoting for systemd unit files, so a role can write rendered argv and env into units safely.

ExecStart= words: double-quoted with C-style escapes, ``%`` doubled (specifiers expand even inside
quotes) and ``$`` doubled (no environment substitution), except a word that is exactly ``${NAME}``, which
is left for systemd to replace with that variable as one argument.
Environment= assignments: double-quoted, ``%`` doubled; ``$`` has no meaning there.
"""

from __future__ import annotations

import re

_SAFE = re.compile(r"^[A-Za-z0-9_./:=,-]+$")
ENV_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def exec_word(arg: str) -> str:
    """One argv element as an ExecStart= word."""
    if ENV_REFERENCE.match(arg):
        return arg
    escaped = arg.replace("%", "%%").replace("$", "$$")
    return escaped if _SAFE.match(escaped) else _quote(escaped)


def exec_line(argv) -> str:
    """A whole argv as the value of ExecStart=."""
    if not argv or not str(argv[0]).startswith("/"):
        raise ValueError(f"ExecStart needs an absolute executable path, got {argv[:1]!r}")
    return " ".join(exec_word(str(arg)) for arg in argv)


def environment_assignment(name: str, value) -> str:
    """One Environment= assignment, quoted: ``"NAME=value"``."""
    if not _ENV_NAME.match(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    return _quote(f"{name}={value}".replace("%", "%%"))
