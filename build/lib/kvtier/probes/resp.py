"""A minimal RESP2 client (standard library only) for probing Valkey/Redis.

Used by the `kv_store_health` module on the storage node and by the kvtier CLI. It speaks just enough
of the protocol to authenticate, run a command and parse the reply; it is not a general client.
"""

from __future__ import annotations

import socket
import time


class RespError(Exception):
    """The server answered with an error reply (``-ERR ...``, ``-NOAUTH ...``, ``-WRONGPASS ...``)."""


class RespProtocolError(Exception):
    """The bytes on the wire are not a RESP reply."""


def encode_command(*args) -> bytes:
    """Encode a command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class _Reader:
    def __init__(self, recv):
        self._recv = recv
        self._buf = b""

    def _fill(self):
        chunk = self._recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self._buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self._buf:
            self._fill()
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line

    def exact(self, n: int) -> bytes:
        while len(self._buf) < n + 2:
            self._fill()
        data, self._buf = self._buf[:n], self._buf[n + 2 :]
        return data

    def reply(self):
        line = self.line()
        if not line:
            raise RespProtocolError("empty reply line")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RespProtocolError(f"unexpected reply type {kind!r}")


def parse_reply(data: bytes):
    """Parse one complete reply from bytes (for tests and recorded traffic)."""
    chunks = [data]

    def recv(_n):
        return chunks.pop() if chunks else b""

    return _Reader(recv).reply()


def parse_info(text: str) -> dict[str, str]:
    """Parse the text of INFO into a flat dict (section headers and blank lines skipped)."""
    info = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, value = line.split(":", 1)
        info[key] = value
    return info


class RespClient:
    """One connection; use as a context manager."""

    def __init__(self, host: str, port: int, timeout: float = 5.0):
        self.host, self.port, self.timeout = host, port, timeout
        self._sock = None
        self._reader = None

    def __enter__(self):
        self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self._reader = _Reader(self._sock.recv)
        return self

    def __exit__(self, *exc):
        if self._sock is not None:
            self._sock.close()
        self._sock = None

    def call(self, *args):
        self._sock.sendall(encode_command(*args))
        return self._reader.reply()

    def auth(self, username: str | None, password: str) -> None:
        if username:
            self.call("AUTH", username, password)
        else:
            self.call("AUTH", password)

    def info(self, *sections: str) -> dict[str, str]:
        raw = self.call("INFO", *sections)
        return parse_info(raw.decode() if isinstance(raw, bytes) else raw)

    def config_get(self, pattern: str) -> dict[str, str]:
        reply = self.call("CONFIG", "GET", pattern)
        pairs = [v.decode() if isinstance(v, bytes) else v for v in reply]
        return dict(zip(pairs[0::2], pairs[1::2], strict=False))


def server_identity(info: dict[str, str]) -> tuple[str, str]:
    """(flavor, version) from INFO server: Valkey reports valkey_version, Redis only redis_version."""
    if "valkey_version" in info:
        return "valkey", info["valkey_version"]
    return info.get("server_name", "redis") or "redis", info.get("redis_version", "unknown")


def flush_all(host: str, port: int, username: str | None, password: str, timeout: float = 10.0) -> str:
    """Empty the whole store (FLUSHALL) as an admin user: only for a lab or an operator who asked for it."""
    with RespClient(host, port, timeout) as client:
        client.auth(username, password)
        reply = client.call("FLUSHALL")
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def matching_keys(
    host: str, port: int, username: str | None, password: str, pattern: str, timeout: float = 10.0
) -> list:
    """Every key matching `pattern` (SCAN, never KEYS: a big store is not blocked), as a user allowed to SCAN."""
    found, cursor = [], b"0"
    with RespClient(host, port, timeout) as client:
        client.auth(username, password)
        while True:
            cursor, keys = client.call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            found += [k.decode() if isinstance(k, bytes) else k for k in keys]
            if cursor in (b"0", "0"):
                return sorted(set(found))


def login_refusal(host: str, port: int, username: str, password: str, timeout: float = 5.0) -> str | None:
    """The server's answer refusing this login, or None when it accepts it: AUTH only, so a user allowed no other
    command passes. OSError or RespProtocolError when the server does not answer."""
    with RespClient(host, port, timeout) as client:
        try:
            client.auth(username, password)
        except RespError as err:
            return str(err)
    return None


def client_view(host: str, port: int, username: str, password: str, timeout: float = 5.0) -> dict:
    """The server as a client with these credentials sees it: {error} or {auth_error} or {ping_ms, info}."""
    facts: dict = {}
    try:
        with RespClient(host, port, timeout) as client:
            try:
                client.auth(username, password)
            except RespError as err:
                facts["auth_error"] = str(err)
                return facts
            rtts = []
            for _ in range(3):  # the median of three: one scheduling hiccup is not the network
                started = time.monotonic()
                client.call("PING")
                rtts.append((time.monotonic() - started) * 1000)
            facts["ping_ms"] = sorted(rtts)[1]
            facts["info"] = client.info("server", "memory", "stats", "keyspace")
            facts["observed_at"] = time.time()  # this host's clock, to date the server's start by its uptime
    except (OSError, RespProtocolError) as err:
        facts["error"] = f"{host}:{port}: {err}"
    return facts
