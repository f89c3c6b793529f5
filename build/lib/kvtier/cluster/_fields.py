"""Reading inventory-like dicts into typed values while collecting every problem at once.

A `Reader` walks one dict section, converts each field to its type and records a message (prefixed with
the field's dotted name, e.g. ``lmcache.chunk_size``) for every value it cannot accept. Unknown keys are
problems too: LMCache drops unknown settings with only a log line, kvtier refuses them up front.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

_MISSING = object()


class Reader:
    """Typed access to one section of the spec; problems go to a shared list."""

    def __init__(self, data, label: str, problems: list, known: tuple = (), hint: Mapping | None = None, namer=None):
        self.label = label
        self.problems = problems
        self._namer = namer
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            problems.append(f"{label} must be a mapping, not {type(data).__name__}")
            data = {}
        self.data = data
        if known:
            hint = hint or {}
            for key in data:
                if key in known:
                    continue
                if key in hint:
                    problems.append(f"{self.name(key)}: {hint[key]}")
                else:
                    problems.append(f"{self.name(key)} is not a known setting; known: {', '.join(known)}")

    def name(self, key: str) -> str:
        if self._namer is not None:
            return self._namer(key)
        return f"{self.label}.{key}" if self.label else str(key)

    def _get(self, key, default):
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                return _MISSING
            return default
        return value

    def _missing(self, key, what):
        self.problems.append(f"{self.name(key)} is required ({what})")

    def string(self, key, default=_MISSING, what="a string", choices=None):
        value = self._get(key, default)
        if value is _MISSING:
            self._missing(key, what)
            return None
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.problems.append(f"{self.name(key)} must be a non-empty string, not {value!r}")
            return None
        if choices is not None and value not in choices:
            self.problems.append(f"{self.name(key)} is {value!r}; choose one of: {', '.join(choices)}")
            return None
        return str(value)

    def integer(self, key, default=_MISSING, what="an integer", minimum=None, maximum=None):
        value = self._get(key, default)
        if value is _MISSING:
            self._missing(key, what)
            return None
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"{self.name(key)} must be an integer, not {value!r}")
            return None
        if minimum is not None and value < minimum or maximum is not None and value > maximum:
            bounds = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
            self.problems.append(f"{self.name(key)} is {value}; it must be {bounds}")
            return None
        return int(value)

    def port(self, key, default=_MISSING):
        return self.integer(key, default, what="a TCP port", minimum=1, maximum=65535)

    def number(self, key, default=_MISSING, what="a number", positive=True, allow_zero=False):
        value = self._get(key, default)
        if value is _MISSING:
            self._missing(key, what)
            return None
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            self.problems.append(f"{self.name(key)} must be a number, not {value!r}")
            return None
        if positive and (value < 0 or value == 0 and not allow_zero):
            self.problems.append(f"{self.name(key)} is {value}; it must be {'>= 0' if allow_zero else '> 0'}")
            return None
        return float(value)

    def boolean(self, key, default=_MISSING):
        value = self._get(key, default)
        if value is _MISSING:
            self._missing(key, "true or false")
            return None
        if not isinstance(value, bool):
            self.problems.append(f"{self.name(key)} must be true or false, not {value!r}")
            return None
        return value

    def string_list(self, key, default=()):
        value = self._get(key, default)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            self.problems.append(f"{self.name(key)} must be a list of strings, not {value!r}")
            return ()
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            self.problems.append(f"{self.name(key)} must hold only strings; got {bad!r}")
            return ()
        return tuple(str(v) for v in value)

    def ip_address(self, key, default=_MISSING, what="an IP address"):
        value = self.string(key, default, what=what)
        if value is None:
            return None
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            self.problems.append(f"{self.name(key)} is {value!r}, which is not an IP address ({what})")
            return None

    def section(self, key, known: tuple = (), hint: Mapping | None = None) -> "Reader":
        return Reader(self.data.get(key), self.name(key), self.problems, known, hint)


def format_number(value: float) -> str:
    """A float as a CLI argument: ``32`` rather than ``32.0``, ``0.25`` as is."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))
