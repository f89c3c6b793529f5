"""The router's admin socket (HAProxy, stdlib only): read each backend server's state and sessions, drain one
and make it ready again. Shared by the kvtier_router_backend module, the lab and the tests.

HAProxy's runtime API takes one command per connection on a UNIX socket and answers in text: ``show stat`` is
CSV with a ``# `` header line, ``set server <backend>/<server> state ready|drain|maint`` answers nothing on
success and a sentence otherwise.
"""

from __future__ import annotations

import base64
import csv
import functools
import http.client
import io
import socket
import time
import urllib.parse
import urllib.request

# What a client sees of a server: "UP" takes new requests; "DRAIN" finishes what it has and takes none;
# "MAINT" is out; "DOWN" failed its health checks. HAProxy may add " 1/2" while a check is going up or down.
STATES = ("ready", "drain", "maint")


class RouterError(Exception):
    """The admin socket could not be used, or refused a command; the message says what to change."""


def command(path: str, line: str, timeout: float = 10.0) -> str:
    """One runtime API command; its whole answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall(line.encode() + b"\n")
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    except OSError as exc:
        raise RouterError(
            f"HAProxy's admin socket {path} did not answer {line.split()[0]!r} ({exc}): is haproxy running with "
            "the router role's configuration?"
        ) from None
    finally:
        sock.close()
    return b"".join(chunks).decode(errors="replace")


def parse_stat(text: str) -> list:
    """Rows of ``show stat`` (CSV whose header starts with '# ') as dicts."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise RouterError(f"unexpected answer to 'show stat': {text.strip()[:200]!r}")
    return list(csv.DictReader(io.StringIO("\n".join([lines[0][2:]] + lines[1:]))))


def servers(path: str, backend: str) -> dict:
    """{server: {status, sessions, queued, weight, check}} of one backend."""
    rows = parse_stat(command(path, "show stat"))
    found = {
        row["svname"]: {
            "status": row["status"].split(" ")[0],
            "sessions": int(row["scur"] or 0),
            "queued": int(row["qcur"] or 0),
            "weight": int(row["weight"] or 0),
            "check": row.get("check_status", ""),
        }
        for row in rows
        if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")
    }
    if not found:
        names = sorted({r["pxname"] for r in rows})
        raise RouterError(f"HAProxy has no backend {backend!r} with servers (it has {', '.join(names) or 'none'})")
    return found


# srv_admin_state bits of `show servers state`: forced, inherited, configured, resolution and hostname maintenance;
# forced and inherited drain.
_MAINT_FLAGS, _DRAIN_FLAGS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40, 0x08 | 0x10


def server_admin_state(path: str, backend: str, server: str) -> str:
    """The admin state set on the server (ready, drain or maint), whatever its health: a drained server whose
    checks fail shows DOWN in `show stat`, the same as a ready one that is down."""
    lines = command(path, f"show servers state {backend}").splitlines()
    header = next((line[2:].split() for line in lines if line.startswith("# be_id")), None)
    for line in lines:
        fields = line.split()
        if header and len(fields) >= len(header) and not line.startswith("#"):
            row = dict(zip(header, fields, strict=False))
            if row["srv_name"] == server:
                flags = int(row["srv_admin_state"])
                return "maint" if flags & _MAINT_FLAGS else "drain" if flags & _DRAIN_FLAGS else "ready"
    raise RouterError(f"HAProxy's server state has no {backend}/{server}")


def set_state(path: str, backend: str, server: str, state: str) -> None:
    if state not in STATES:
        raise RouterError(f"state {state!r} is not one of {', '.join(STATES)}")
    answer = command(path, f"set server {backend}/{server} state {state}").strip()
    if answer:
        raise RouterError(f"HAProxy refused 'set server {backend}/{server} state {state}': {answer}")


def wait_idle(path: str, backend: str, server: str, timeout: float, interval: float = 0.5) -> dict:
    """Wait until the server has no session (every request the router sent it has been answered)."""
    deadline = time.monotonic() + timeout
    while True:
        current = servers(path, backend)[server]
        if current["sessions"] == 0:
            return current
        if time.monotonic() > deadline:
            raise RouterError(
                f"{backend}/{server} still has {current['sessions']} session(s) after {timeout:.0f} s of draining"
            )
        time.sleep(interval)


def wait_status(path: str, backend: str, server: str, statuses, timeout: float, interval: float = 1.0) -> dict:
    """Wait until the server's status is one of `statuses` (e.g. UP once its health checks pass)."""
    deadline = time.monotonic() + timeout
    while True:
        current = servers(path, backend)[server]
        if current["status"] in statuses:
            return current
        if time.monotonic() > deadline:
            raise RouterError(
                f"{backend}/{server} is {current['status']} (last check: {current['check'] or 'none'}) after "
                f"{timeout:.0f} s, not {'/'.join(statuses)}"
            )
        time.sleep(interval)


def basic_auth(user: str, password: str) -> str:
    """An Authorization header's value for the statistics page's login."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def backend_states(csv_text: str, backend: str) -> dict:
    """{server: status} of `backend` in the statistics page's CSV."""
    return {
        row["svname"]: row["status"].split(" ")[0]
        for row in parse_stat(csv_text)
        if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")
    }


class StatsReader:
    """Reads the statistics page again and again over one kept-alive connection: a watcher that polls it twice a
    second costs the router one TLS handshake, not two a second. A failed read drops the connection; the next read
    opens another."""

    def __init__(self, url: str, backend: str, timeout: float = 5.0, login: tuple | None = None, context=None):
        parts = urllib.parse.urlsplit(url)
        self._open = functools.partial(
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection,
            parts.hostname,
            parts.port,
            timeout=timeout,
            **({"context": context} if parts.scheme == "https" and context is not None else {}),
        )
        self._path = (parts.path or "/") + ";csv"
        self._headers = {"Authorization": basic_auth(*login)} if login else {}
        self._backend = backend
        self._connection = None

    def read(self) -> dict:
        """{server: status}; OSError or RouterError when the page cannot be read."""
        try:
            if self._connection is None:
                self._connection = self._open()
            self._connection.request("GET", self._path, headers=self._headers)
            reply = self._connection.getresponse()
            body = reply.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise RouterError(f"statistics page: {exc}") from None
        if reply.status != 200:
            self.close()
            raise RouterError(f"statistics page answered HTTP {reply.status}")
        return backend_states(body, self._backend)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def stats_over_http(url: str, backend: str, timeout: float = 5.0, login: tuple | None = None) -> dict:
    """{server: status} from the router's read-only statistics page (``<url>;csv``), as a client host reads it;
    `login`: (user, password) where the page asks for one."""
    headers = {"Authorization": basic_auth(*login)} if login else {}
    request = urllib.request.Request(url + ";csv", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (the router's own page)
        return backend_states(reply.read().decode(errors="replace"), backend)
