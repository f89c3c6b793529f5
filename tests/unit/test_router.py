"""The router: backends from the spec, and the role's HAProxy configuration run by a real HAProxy.

HAProxy (the distribution's, installed by scripts/bootstrap.sh) runs the configuration rendered from the role's
template in front of two small HTTP servers that stand in for vLLM (they answer /health and /v1/completions with
their name); the affinity, the drain through the admin socket, the module and the statistics page are real.
"""

import contextlib
import http.client
import http.server
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request

import jinja2
import kvtier_router_backend
import pytest
import yaml

from kvtier.bench.stream import ClientStream, summarize
from kvtier.cluster import RenderError, load_spec
from kvtier.cluster.render import router_backends
from kvtier.cluster.tenants import salt
from kvtier.lab import credentials, day2
from kvtier.lab.day2 import RouterWatch, out_of_rotation
from kvtier.lab.stages import StageFailed
from kvtier.probes import router as router_probe
from tests.unit._cluster_data import spec_dict

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "router"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
_FILTERS = importlib.util.spec_from_file_location("router_filters", ROLE / "filter_plugins" / "router.py")
router_filters = importlib.util.module_from_spec(_FILTERS)
_FILTERS.loader.exec_module(router_filters)
# The router's secrets in these tests (the role reads them from the vault).
TENANTS = [
    {"name": "team-a", "api_key": "tenant-a-key-0123456789abcdef"},
    {"name": "team-b", "api_key": "tenant-b-key-0123456789abcdef"},
]
SECRETS = {
    "router_cache_salt_secret": "salt-secret-0123456789abcdef",
    "router_vllm_api_key": "vllm-key-0123456789abcdef",
    "router_stats_password": "stats-password-0123456789",
}


def test_backends_are_every_spark_at_its_data_address_in_spec_order():
    backends = router_backends(load_spec(spec_dict()))
    assert backends == [
        {"name": "spark01", "address": "10.10.0.21", "port": 8000},
        {"name": "spark02", "address": "10.10.0.22", "port": 8000},
        {"name": "spark03", "address": "10.10.0.23", "port": 8000},
    ]


def test_backends_refuse_a_vllm_bound_to_loopback():
    with pytest.raises(RenderError, match="cannot reach a vLLM bound to loopback"):
        router_backends(load_spec(spec_dict(vllm={"block_size": 16, "gpu_kv_cache_gib": 40, "host": "127.0.0.1"})))


def test_parse_stat_reads_haproxy_csv():
    text = (
        "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,"
        "weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,"
        "rate_lim,rate_max,check_status\n"
        "vllm,spark01,0,0,2,3,,9,1,1,,0,,0,0,0,0,UP,1,1,0,0,0,5,0,,1,3,1,,9,,2,0,,1,L7OK\n"
        "vllm,spark02,0,0,0,1,,4,1,1,,0,,0,0,0,0,DRAIN,1,1,0,0,0,5,0,,1,3,2,,4,,2,0,,1,L7OK\n"
        "vllm,BACKEND,0,0,2,3,,13,1,1,0,0,,0,0,0,0,UP,1,1,0,,0,5,0,,1,3,0,,13,,1,0,,1,\n"
    )
    rows = router_probe.parse_stat(text)
    assert [(r["svname"], r["status"], r["scur"]) for r in rows] == [
        ("spark01", "UP", "2"),
        ("spark02", "DRAIN", "0"),
        ("BACKEND", "UP", "2"),
    ]
    with pytest.raises(router_probe.RouterError, match="unexpected answer"):
        router_probe.parse_stat("Unknown command\n")


def test_out_of_rotation_counts_every_status_but_up():
    history = {"spark01": [(0.0, "UP"), (10.0, "DRAIN"), (14.0, "DOWN"), (20.0, "UP")], "spark02": [(0.0, "UP")]}
    assert out_of_rotation(history, until=30.0) == {"spark01": 10.0, "spark02": 0.0}


def test_client_summary_counts_failures_and_ttft():
    ok = {"ok": True, "status": 200, "ttft": 0.1, "seconds": 0.2, "error": ""}
    results = [
        ok,
        dict(ok, ttft=0.3, seconds=0.5),
        {"ok": False, "status": 502, "ttft": None, "seconds": 0.0, "error": "x"},
    ]
    summary = summarize(results)
    assert (summary["requests"], summary["failed"], summary["ttft_max"], summary["seconds_max"]) == (3, 1, 0.3, 0.5)
    assert summary["errors"] == ["502: x"]


def test_a_request_cut_while_a_spark_stops_is_reported_but_any_other_failure_fails_the_stage():
    class Recorded:  # what a ClientStream and a RouterWatch hold after a stage
        def __init__(self, results, history):
            self.results, self.history = results, history

        def out_of_rotation(self):
            return out_of_rotation(self.history, until=100.0)

        def last(self):
            return {server: seen[-1][1] for server, seen in self.history.items()}

    ok = {"ok": True, "status": 200, "ttft": 0.2, "seconds": 0.3, "error": ""}
    cut = {"ok": False, "status": 200, "ttft": 0.2, "seconds": 2.0, "at": 51.0, "error": "connection reset"}
    late = dict(cut, at=80.0, error="aborted")
    watch = Recorded(None, {"spark01": [(0.0, "UP")], "spark02": [(0.0, "UP"), (52.0, "DOWN"), (90.0, "UP")]})
    printed: list = []
    results = [dict(ok, at=10.0), cut, dict(ok, at=60.0)]
    note = day2.report(printed.append, Recorded(results, None), watch, leaving={"spark02"}, stopping=(50.0, 55.0))
    assert note.startswith("0 of 2 client requests failed (1 cut by the stop)")
    assert any("was cut: 200 connection reset" in line for line in printed)
    with pytest.raises(StageFailed, match="1 of 3 requests failed"):  # after the stop: the router's to answer for
        day2.report(print, Recorded(results + [late], None), watch, leaving={"spark02"}, stopping=(50.0, 55.0))
    with pytest.raises(StageFailed, match="1 of 3 requests failed"):  # no stop named: nothing is excused
        day2.report(print, Recorded(results, None), watch, leaving={"spark02"})


# --- a real HAProxy with the role's configuration ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _StandIn(http.server.ThreadingHTTPServer):
    """Stands in for one Spark's vLLM: /health, /v1/models and /v1/completions answer with its name."""

    daemon_threads = True

    def __init__(self, name: str):
        self.name, self.seen, self.headers_seen, self.delay = name, [], [], 0.0

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(handler, body: bytes):
                handler.send_response(200)
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def do_GET(handler):
                if handler.path != "/health":
                    self.headers_seen.append({k.lower(): v for k, v in handler.headers.items()})
                handler._answer(json.dumps({"data": [{"id": "m"}], "server": name}).encode())

            def do_POST(handler):
                body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
                self.seen.append(body["prompt"])
                self.headers_seen.append({k.lower(): v for k, v in handler.headers.items()})
                time.sleep(self.delay)
                if not body.get("stream"):
                    handler._answer(name.encode())
                    return
                usage = {"prompt_tokens": 8, "prompt_tokens_details": {"cached_tokens": 4}}
                events = [{"choices": [{"text": name}]}, {"choices": [], "usage": usage}]
                handler._answer(
                    b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
                )

            def log_message(handler, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def render_config(tmp_path, backends, **overrides) -> pathlib.Path:
    """The role's configuration, and the secrets files the role writes beside it (in `tmp_path`)."""
    variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables.update(
        ansible_managed="test",
        router_bind_address="127.0.0.1",
        router_port=_free_port(),
        router_stats_port=_free_port(),
        router_metrics_port=_free_port(),
        _router_metrics_address="127.0.0.1",
        router_admin_socket=str(tmp_path / "admin.sock"),
        router_health_interval_ms=200,
        router_secrets_dir=str(tmp_path),
        router_tenants=TENANTS,
        _router_backends=backends,
        **SECRETS,
        **overrides,
    )
    (tmp_path / "tenants.map").write_text(
        router_filters.router_tenant_map(TENANTS, SECRETS["router_cache_salt_secret"])
    )
    cert, key = credentials.certificate(tmp_path, "127.0.0.1")
    (tmp_path / "router.pem").write_text(cert.read_text() + key.read_text())
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), keep_trailing_newline=True)
    env.filters["ansible.utils.ipwrap"] = lambda address: address  # IPv4 only here
    # The test runs HAProxy as the current user: no user/group switch.
    text = env.get_template("haproxy.cfg.j2").render(**variables).replace("    user haproxy\n    group haproxy\n", "")
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps(variables, default=str))
    return path


@contextlib.contextmanager
def haproxy(tmp_path, backends, **overrides):
    config = render_config(tmp_path, backends, **overrides)
    variables = json.loads(config.with_suffix(".json").read_text())
    env = dict(
        os.environ,
        KVTIER_VLLM_API_KEY=SECRETS["router_vllm_api_key"],
        KVTIER_ROUTER_STATS_PASSWORD=SECRETS["router_stats_password"],
    )
    proc = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # until every backend passes its health checks
            try:
                states = router_probe.servers(variables["router_admin_socket"], "vllm")
                if all(s["status"] == "UP" for s in states.values()):
                    break
            except router_probe.RouterError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "HAProxy's backends never came UP"
            time.sleep(0.2)
        yield variables
    finally:
        proc.terminate()
        proc.wait(10)


def _url(variables, port: str = "router_port") -> str:
    return f"https://127.0.0.1:{variables[port]}"


def _tls(variables) -> ssl.SSLContext:
    """A client that trusts the router's certificate."""
    return ssl.create_default_context(cafile=str(pathlib.Path(variables["router_secrets_dir"]) / "router.crt"))


@pytest.fixture
def trusting(monkeypatch, tmp_path):
    """This process's urllib clients (ClientStream, RouterWatch) trust the router's certificate, for one test."""
    monkeypatch.setattr(urllib.request, "_opener", None)
    credentials.certificate(tmp_path, "127.0.0.1")
    credentials.trust_router(tmp_path)
    return credentials.router_context(tmp_path)


def _request(variables, path: str, headers=None, body=None, port: str = "router_port") -> tuple:
    """(status, body text) of a request to the router."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(_url(variables, port) + path, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=_tls(variables)) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _complete(variables, prompt: str, key: str = TENANTS[0]["api_key"]) -> str:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    status, text = _request(variables, "/v1/completions", headers, {"model": "m", "prompt": prompt, "max_tokens": 1})
    assert status == 200, text
    return text


@pytest.fixture
def stand_ins():
    servers = [_StandIn("spark01"), _StandIn("spark02")]
    yield servers
    for server in servers:
        server.shutdown()


def _backends(servers):
    return [{"name": s.name, "address": "127.0.0.1", "port": s.server_address[1]} for s in servers]


def test_haproxy_accepts_the_rendered_configuration(tmp_path):
    backends = [{"name": "spark01", "address": "10.0.0.21", "port": 8000}]
    for prefix, tls in ((256, True), (0, True), (256, False)):  # affinity or least connections; HTTPS or not
        config = render_config(tmp_path, backends, router_prefix_bytes=prefix, router_tls=tls)
        check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        text = config.read_text()
        assert ("ssl crt" in text) is tls
        assert not any(value in text for value in SECRETS.values())  # secrets stay in their root-only files
        assert not any(t["api_key"] in text for t in TENANTS)


def test_only_a_tenant_gets_through_and_the_spark_gets_vllm_key_and_the_tenant_salt(tmp_path, stand_ins):
    with haproxy(tmp_path, _backends(stand_ins), router_prefix_bytes=0) as variables:
        spoofed = {"Authorization": "Bearer not-a-tenant-key-000000", "X-Kvtier-Tenant-Salt": "chosen"}
        for headers in ({}, spoofed, {"Authorization": f"Bearer {SECRETS['router_vllm_api_key']}"}):
            status, text = _request(variables, "/v1/models", headers)
            assert status == 401 and "API key is required" in text
        assert not any(s.headers_seen for s in stand_ins)  # nothing refused reached a Spark
        for tenant in TENANTS:
            _complete(variables, f"a prompt of {tenant['name']}", tenant["api_key"])
        seen = [h for s in stand_ins for h in s.headers_seen]
        assert {h["authorization"] for h in seen} == {f"Bearer {SECRETS['router_vllm_api_key']}"}
        assert sorted(h["x-kvtier-tenant-salt"] for h in seen) == sorted(
            salt(SECRETS["router_cache_salt_secret"], t["name"]) for t in TENANTS
        )
        # A client's own salt header is dropped: the tenant's replaces it.
        key = TENANTS[1]["api_key"]
        _request(variables, "/v1/models", {"Authorization": f"Bearer {key}", "X-Kvtier-Tenant-Salt": "chosen"})
        last = [h for s in stand_ins for h in s.headers_seen if "chosen" in h.get("x-kvtier-tenant-salt", "")]
        assert last == []
        # vLLM's other routes are not for clients.
        assert _request(variables, "/metrics", {"Authorization": f"Bearer {key}"})[0] == 404
        # Plain HTTP on the TLS port gets no answer from a Spark.
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{variables['router_port']}/v1/models", timeout=5)


def test_prompts_with_the_same_prefix_go_to_the_same_spark(tmp_path, stand_ins):
    with haproxy(tmp_path, _backends(stand_ins), router_prefix_bytes=64) as variables:
        prefixes = [f"document {n} " + "x" * 80 for n in range(12)]
        first = {p: _complete(variables, p + " first question") for p in prefixes}
        again = {p: _complete(variables, p + " another question") for p in prefixes}
        assert first == again  # the first 64 bytes pick the Spark
        assert set(first.values()) == {"spark01", "spark02"}  # and the prefixes are spread over both


def test_a_drained_spark_gets_no_request_and_comes_back(tmp_path, stand_ins):
    with haproxy(tmp_path, _backends(stand_ins), router_prefix_bytes=64) as variables:
        sock = variables["router_admin_socket"]
        prompts = [f"prompt {n} " + "y" * 80 for n in range(12)]
        router_probe.set_state(sock, "vllm", "spark02", "drain")
        assert router_probe.servers(sock, "vllm")["spark02"]["status"] == "DRAIN"
        assert {_complete(variables, p) for p in prompts} == {"spark01"}
        router_probe.set_state(sock, "vllm", "spark02", "ready")
        router_probe.wait_status(sock, "vllm", "spark02", ("UP",), timeout=10)
        assert {_complete(variables, p) for p in prompts} == {"spark01", "spark02"}
        with pytest.raises(router_probe.RouterError, match="No such server"):
            router_probe.set_state(sock, "vllm", "spark03", "drain")


def test_a_drained_spark_that_went_down_is_still_drained(tmp_path, stand_ins):
    # Found in the lab: a Spark drained and restarted shows DOWN until its checks pass, the same as a ready Spark
    # that is down; reading the admin state from that status skipped the "ready" and left it drained for good.
    with haproxy(tmp_path, _backends(stand_ins)) as variables:
        sock = variables["router_admin_socket"]
        router_probe.set_state(sock, "vllm", "spark02", "drain")
        stand_ins[1].shutdown()
        stand_ins[1].server_close()
        router_probe.wait_status(sock, "vllm", "spark02", ("DOWN",), timeout=30)
        assert router_probe.server_admin_state(sock, "vllm", "spark02") == "drain"
        assert router_probe.server_admin_state(sock, "vllm", "spark01") == "ready"
        router_probe.set_state(sock, "vllm", "spark02", "ready")
        assert router_probe.server_admin_state(sock, "vllm", "spark02") == "ready"
        router_probe.set_state(sock, "vllm", "spark01", "maint")
        assert router_probe.server_admin_state(sock, "vllm", "spark01") == "maint"


def test_drain_waits_for_the_request_in_flight(tmp_path, stand_ins):
    with haproxy(tmp_path, _backends(stand_ins), router_prefix_bytes=0) as variables:
        sock = variables["router_admin_socket"]
        for server in stand_ins:
            server.delay = 1.5
        answered = []
        threads = [threading.Thread(target=lambda: answered.append(_complete(variables, "slow"))) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # both requests are in flight, one on each Spark (least connections)
        busy = router_probe.servers(sock, "vllm")
        assert sum(s["sessions"] for s in busy.values()) == 2
        router_probe.set_state(sock, "vllm", "spark02", "drain")
        idle = router_probe.wait_idle(sock, "vllm", "spark02", timeout=10)
        assert idle["sessions"] == 0
        for t in threads:
            t.join()
        assert sorted(answered) == ["spark01", "spark02"]  # the drained Spark finished its request


def test_the_module_changes_only_what_differs_and_names_an_unknown_spark(tmp_path, stand_ins, capsys):
    from ansible.module_utils.testing import patch_module_args

    with haproxy(tmp_path, _backends(stand_ins)) as variables:
        sock = variables["router_admin_socket"]

        def run(check_mode=False, **params):
            args = {"socket": sock, "backend": "vllm", "timeout": 10, "_ansible_check_mode": check_mode, **params}
            with patch_module_args(args), pytest.raises(SystemExit):
                kvtier_router_backend.main()
            return json.loads(capsys.readouterr().out)

        assert run(check_mode=True, server="spark02", state="drain")["changed"] is True
        assert router_probe.servers(sock, "vllm")["spark02"]["status"] == "UP"  # check mode changed nothing
        assert run(server="spark02", state="drain")["changed"] is True
        assert run(server="spark02", state="drain")["changed"] is False
        assert run(server="spark02")["server"]["status"] == "DRAIN"  # read only: healthy and drained
        assert run(server="spark02", state="ready")["changed"] is True
        failed = run(server="spark09", state="drain")
        assert failed["failed"] and "has no server spark09 (it has spark01, spark02)" in failed["msg"]


def test_prometheus_reads_each_sparks_state_and_nothing_else(tmp_path, stand_ins):
    with haproxy(tmp_path, _backends(stand_ins)) as variables:
        base = f"http://127.0.0.1:{variables['router_metrics_port']}"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
            text = answer.read().decode()
        for spark in ("spark01", "spark02"):
            assert f'haproxy_server_status{{proxy="vllm",server="{spark}",state="UP"}} 1' in text
        with pytest.raises(urllib.error.HTTPError) as refused:  # not the statistics page, not the API
            urllib.request.urlopen(base + "/stats", timeout=5)
        assert refused.value.code == 403


def test_the_statistics_page_shows_each_spark_behind_its_login(tmp_path, stand_ins, trusting):
    with haproxy(tmp_path, _backends(stand_ins)) as variables:
        url = _url(variables, "router_stats_port") + "/stats"
        login = (variables["router_stats_user"], SECRETS["router_stats_password"])
        assert router_probe.stats_over_http(url, "vllm", login=login) == {"spark01": "UP", "spark02": "UP"}
        for wrong in (None, (login[0], "not-the-password")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                router_probe.stats_over_http(url, "vllm", login=wrong)
            assert refused.value.code == 401
        # A watcher reads it over one kept-alive connection (one TLS handshake), and opens another after a failure.
        reader = router_probe.StatsReader(url, "vllm", login=login, context=trusting)
        try:
            assert [reader.read() for _ in range(3)][-1] == {"spark01": "UP", "spark02": "UP"}
            first = reader._connection.sock
            assert reader.read() and reader._connection.sock is first
            first.close()
            with pytest.raises(router_probe.RouterError):
                reader.read()
            assert reader.read() == {"spark01": "UP", "spark02": "UP"}
        finally:
            reader.close()
        with pytest.raises(router_probe.RouterError, match="HTTP 401"):
            router_probe.StatsReader(url, "vllm", context=trusting).read()


def test_the_module_refuses_to_drain_the_last_spark_in_rotation(tmp_path, stand_ins, capsys):
    from ansible.module_utils.testing import patch_module_args

    with haproxy(tmp_path, _backends(stand_ins)) as variables:
        sock = variables["router_admin_socket"]
        router_probe.set_state(sock, "vllm", "spark01", "drain")
        args = {"socket": sock, "backend": "vllm", "server": "spark02", "state": "drain", "timeout": 10}
        with patch_module_args(args), pytest.raises(SystemExit):
            kvtier_router_backend.main()
        result = json.loads(capsys.readouterr().out)
        assert (
            result["failed"]
            and "would leave no Spark in rotation" in result["msg"]
            and "spark01 DRAIN" in result["msg"]
        )
        assert router_probe.servers(sock, "vllm")["spark02"]["status"] == "UP"  # nothing changed


def test_a_client_stream_sees_no_failure_while_a_spark_is_drained_and_the_watch_times_it(tmp_path, stand_ins, trusting):
    with haproxy(tmp_path, _backends(stand_ins)) as variables:
        sock = variables["router_admin_socket"]
        url, stats = _url(variables), _url(variables, "router_stats_port") + "/stats"
        key, login = TENANTS[0]["api_key"], (variables["router_stats_user"], SECRETS["router_stats_password"])
        stream = ClientStream(url, "m", [f"prompt {n}" for n in range(4)], interval=0.05, timeout=10, api_key=key)
        with RouterWatch(stats, "vllm", interval=0.1, login=login, context=trusting) as watch, stream:
            time.sleep(0.5)
            router_probe.set_state(sock, "vllm", "spark02", "drain")
            time.sleep(1.0)
            router_probe.set_state(sock, "vllm", "spark02", "ready")
            time.sleep(0.5)
        summary = stream.summary()
        assert summary["requests"] > 10 and summary["failed"] == 0 and summary["ttft_p50"] is not None
        away = watch.out_of_rotation()
        assert away["spark02"] > 0 and away["spark01"] == 0.0
        assert [status for _, status in watch.history["spark02"]] == ["UP", "DRAIN", "UP"]
