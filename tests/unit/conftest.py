"""Make library/ modules importable in unit tests, and the fixtures several test modules share.

Modules import their shared code as ``ansible.module_utils.kvtier_<name>``; in production Ansible ships
module_utils/kvtier_<name>.py (a symlink to kvtier/probes/<name>.py) with the module. Here the same
source is registered under that name, so tests exercise exactly the code that runs on targets.
"""

import http.server
import importlib
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import time

import ansible.module_utils
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _alias_module_utils():
    for link in (ROOT / "module_utils").glob("kvtier_*.py"):
        probe = link.resolve().stem
        mod = importlib.import_module(f"kvtier.probes.{probe}")
        sys.modules[f"ansible.module_utils.{link.stem}"] = mod
        setattr(ansible.module_utils, link.stem, mod)


_alias_module_utils()
sys.path.insert(0, str(ROOT / "library"))


# --- shared fixtures --------------------------------------------------------------------------------------------

LMCACHE_RECORDINGS = ROOT / "tests" / "fixtures" / "lmcache"


def _recorded(name):
    return (LMCACHE_RECORDINGS / name).read_text()


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):  # noqa: N802
        status, body = self.routes.get(self.path, (404, "not found"))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def recorded_endpoints():
    """LMCache's and vLLM's HTTP endpoints answering with recorded LMCache 0.5.6 / vLLM outputs: (url, routes)."""
    routes = {
        "/healthcheck": (200, '{"status":"healthy"}'),
        "/status": (200, _recorded("lmcache_status_hits.json")),
        "/metrics": (200, _recorded("lmcache_metrics_hits.txt") + _recorded("vllm_metrics_hits.txt")),
        "/health": (200, ""),
        "/v1/models": (200, _recorded("vllm_models.json")),
    }
    handler = type("H", (_Handler,), {"routes": routes})
    httpd = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", routes
    httpd.shutdown()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A real redis-server on loopback with an ACL user, when the binary is installed (it is in CI)."""
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if not binary:
        pytest.fail("no redis-server or valkey-server binary: run scripts/bootstrap.sh, which installs it")
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--user",
            "default",
            "off",
            "--user",
            "probe",
            "on",
            ">probe-password-1234567",
            "~*",
            "+@all",
            # A user who may only read and write keys (no PING, no INFO), as a store's ACL may have it.
            "--user",
            "keys-only",
            "on",
            ">keys-only-password-12345",
            "~*",
            "-@all",
            "+get",
            "+set",
        ],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)
