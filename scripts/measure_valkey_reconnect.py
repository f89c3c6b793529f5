"""What LMCache's `valkey` route does when its L2 server restarts or is down: LMCache 0.5.6's ValkeyWorkerPool (the
I/O layer its valkey L2 adapter stores and loads through; valkey-glide-sync clients, one per worker) against a real
redis-server on this machine. Prints one line per phase: requests, failures, seconds per request, and how long after
the server came back the first store succeeded.

    python scripts/measure_valkey_reconnect.py        (in a venv with lmcache 0.5.6 and valkey-glide-sync)
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

from lmcache.v1.storage_backend.valkey.worker_pool import ValkeyWorkerPool

PORT = 6391
WORKERS = 4
PAYLOAD = os.urandom(1 << 20)  # a 1 MiB chunk


def start_server(password: str, directory: str) -> subprocess.Popen:
    """redis-server on loopback, its password (if any) read from a config file (never on its command line)."""
    if subprocess.run(["redis-cli", "-p", str(PORT), "ping"], capture_output=True).returncode == 0:
        raise SystemExit(f"port {PORT} is already taken: stop what listens there first")
    config = os.path.join(directory, "redis.conf")
    with open(config, "w") as handle:
        handle.write(f'port {PORT}\nbind 127.0.0.1\nsave ""\nappendonly no\n')
        handle.write(f"requirepass {password}\n" if password else "")
    server = subprocess.Popen([shutil.which("redis-server"), config], stdout=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", str(PORT), "ping"], capture_output=True).returncode == 0:
            return server
        time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def stores(pool: ValkeyWorkerPool, seconds: float, until_ok: bool = False) -> dict:
    """Stores one after another for `seconds` (or until one succeeds): counts, failures, time each took."""
    took, failed, errors, first_ok = [], 0, set(), None
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        key = f"measure-{secrets.token_hex(4)}"
        t = time.monotonic()
        try:
            pool.submit_set(key, PAYLOAD).result(timeout=60)
        except Exception as exc:  # what LMCache's adapter sees: the future's exception
            failed += 1
            errors.add(f"{type(exc).__name__}: {str(exc)[:100]}")
        else:
            first_ok = first_ok if first_ok is not None else time.monotonic() - began
            if until_ok:
                took.append(time.monotonic() - t)
                break
        took.append(time.monotonic() - t)
        time.sleep(0.2)
    return {
        "requests": len(took),
        "failed": failed,
        "max_s": max(took, default=0),
        "first_ok_s": first_ok,
        "errors": sorted(errors),
    }


def say(phase: str, seen: dict) -> None:
    first = "never" if seen["first_ok_s"] is None else f"{seen['first_ok_s']:.2f} s"
    print(
        f"{phase}: {seen['requests']} stores, {seen['failed']} failed, slowest {seen['max_s']:.2f} s, "
        f"first success after {first}; {'; '.join(seen['errors']) or 'no error'}"
    )


def pool(password: str, workers: int, swapped: bool) -> ValkeyWorkerPool:
    """LMCache's pool logging in as the user `default`; `swapped`: username and password given as kvtier renders them
    for LMCache 0.5.6 (kvtier.cluster.render), whose pool hands them to glide's ServerCredentials(password, username)
    in the wrong order."""
    user, secret = (password, "default") if swapped else ("default", password)
    return ValkeyWorkerPool(
        [("127.0.0.1", PORT)], workers, username=user, password=secret, request_timeout=5.0, connection_timeout=10.0
    )


def login(password: str, swapped: bool) -> str:
    try:
        pool(password, 1, swapped).close()
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {str(exc)[:120]}"
    return "logged in"


def main() -> int:
    password = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as directory:
        server = start_server(password, directory)
        print(f"login, username and password as named: {login(password, swapped=False)}")
        print(f"login, as kvtier renders them for 0.5.6: {login(password, swapped=True)}")
        workers = pool(password, WORKERS, swapped=True)
        try:
            say("server up", stores(workers, 3))
            server.terminate()
            server.wait()
            say("server stopped (20 s)", stores(workers, 20))
            server = start_server(password, directory)
            say("server back, emptied (until a store succeeds, at most 120 s)", stores(workers, 120, until_ok=True))
            say("server back, then (5 s)", stores(workers, 5))
            server.kill()  # gone without a goodbye, then back at once: a restart
            server.wait()
            server = start_server(password, directory)
            say("server restarted at once (until a store succeeds, at most 120 s)", stores(workers, 120, until_ok=True))
            say("after the restart (5 s)", stores(workers, 5))
        finally:
            workers.close()
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
