"""What Prometheus scrapes (kvtier.monitoring.targets), who the firewall lets scrape it, and the LMCache relay."""

import http.server
import importlib.util
import pathlib
import shutil
import subprocess
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from kvtier.cluster import firewall, load_spec
from kvtier.monitoring import targets
from tests.unit._cluster_data import spec_dict

ROOT = pathlib.Path(__file__).resolve().parents[2]
GROUPS = {
    "spark": ["spark01", "spark02"],
    "storage": ["kv-storage01"],
    "kvtier_router": ["kv-storage01"],
    "kvtier_monitoring": ["ops01"],
}
HOSTVARS = {
    "spark01": {"kvtier_data_address": "10.10.0.21"},
    "spark02": {"kvtier_data_address": "10.10.0.22", "node_exporter_port": 9200},
    "kv-storage01": {"kvtier_data_address": "10.10.0.10"},
    "ops01": {"kvtier_data_address": "fd00::30"},
}


def by_job(found):
    jobs = {}
    for t in found:
        jobs.setdefault(t.job, []).append((t.host, t.endpoint))
    return jobs


def test_every_node_every_exporter_once_at_its_data_address():
    jobs = by_job(targets.targets(GROUPS, HOSTVARS, vllm_port=8000, has_l2=True))
    # The storage node is also the router host: one node_exporter there, not two.
    assert jobs["node"] == [
        ("spark01", "10.10.0.21:9100"),
        ("spark02", "10.10.0.22:9200"),  # an inventory variable moves a port
        ("kv-storage01", "10.10.0.10:9100"),
        ("ops01", "[fd00::30]:9100"),
    ]
    assert jobs["vllm"] == [("spark01", "10.10.0.21:8000"), ("spark02", "10.10.0.22:8000")]
    assert jobs["lmcache"] == [("spark01", "10.10.0.21:9481"), ("spark02", "10.10.0.22:9481")]
    assert jobs["l2"] == [("kv-storage01", "10.10.0.10:9121")]
    assert jobs["router"] == [("kv-storage01", "10.10.0.10:8405")]
    assert "l2" not in by_job(targets.targets(GROUPS, HOSTVARS, vllm_port=8000, has_l2=False))


def test_a_host_without_a_data_address_is_named():
    hostvars = {**HOSTVARS, "spark02": {}}
    with pytest.raises(targets.TargetError, match=r"spark02 \(spark\) has no kvtier_data_address"):
        targets.targets(GROUPS, hostvars, vllm_port=8000, has_l2=True)


def test_the_health_textfile_keeps_its_host_labels(tmp_path):
    config = targets.scrape_config(targets.targets(GROUPS, HOSTVARS, 8000, True), "10s", [])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["node"]["honor_labels"] is True  # kvtier_health_status{host="spark01"} scraped from ops01
    assert all("honor_labels" not in job for name, job in jobs.items() if name != "node")
    assert {c["labels"]["host"] for c in jobs["vllm"]["static_configs"]} == {"spark01", "spark02"}
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed (scripts/bootstrap.sh installs Debian's prometheus)")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_firewall_admits_the_monitoring_hosts_to_exporters_and_the_operator_to_prometheus():
    spec = load_spec(spec_dict())
    found = targets.targets(GROUPS, HOSTVARS, 8000, True)
    scrapers = targets.scrapers(GROUPS, HOSTVARS)
    assert scrapers == ("fd00::30",)
    store, router = (
        firewall.Storage("kv-storage01", "10.10.0.10"),
        firewall.Router("kv-storage01", "10.10.0.10", 8000, 8404),
    )
    spark = firewall.rules(
        spec,
        "spark02",
        store,
        router,
        admin=("10.10.0.5",),
        scrapers=scrapers,
        scraped=targets.scraped_on(found, "spark02"),
    )
    ports = {r.port: r for r in spark.input}
    assert ports[8000].peers == ("10.10.0.10", "10.10.0.5", "fd00::30")  # vLLM's /metrics
    assert ports[9200].peers == ports[9481].peers == ("fd00::30",)
    storage = firewall.rules(
        spec, "kv-storage01", store, router, scrapers=scrapers, scraped=targets.scraped_on(found, "kv-storage01")
    )
    assert {r.port for r in storage.input if r.peers == ("fd00::30",)} == {9100, 9121, 8405}
    ops = firewall.rules(
        spec,
        "ops01",
        store,
        router,
        admin=("10.10.0.5",),
        scrapers=scrapers,
        prometheus_port=9090,
        scraped=targets.scraped_on(found, "ops01"),
    )
    assert {(r.port, r.peers) for r in ops.input} == {(9100, ("fd00::30",)), (9090, ("10.10.0.5",))}


def test_each_exporters_port_is_its_roles_default():
    roles = {
        "node_exporter_port": "node_exporter",
        "vllm_lmcache_metrics_port": "vllm_lmcache",
        "kv_store_exporter_port": "kv_store",
        "router_metrics_port": "router",
    }
    for exporter in targets.EXPORTERS:
        if exporter.job == "vllm":
            continue
        defaults = yaml.safe_load((ROOT / "roles" / roles[exporter.port_var] / "defaults" / "main.yml").read_text())
        assert defaults[exporter.port_var] == exporter.default_port, exporter.port_var


def _relay():
    path = ROOT / "roles" / "vllm_lmcache" / "files" / "kvtier_lmcache_metrics.py"
    spec = importlib.util.spec_from_file_location("kvtier_lmcache_metrics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_the_relay_serves_lmcaches_metrics_and_nothing_else_of_its_api():
    class LMCache(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"lmcache_mp_lookup_hit_tokens_total 42\n" if self.path == "/metrics" else b"cleared"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LMCache)
    relay = _relay().serve("127.0.0.1", 0, _serve(upstream) + "/metrics")
    base = _serve(relay)
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
            assert answer.read() == b"lmcache_mp_lookup_hit_tokens_total 42\n"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/clear", timeout=5)
        assert refused.value.code == 404
        upstream.shutdown()
        upstream.server_close()
        with pytest.raises(urllib.error.HTTPError) as down:  # LMCache down: a failed scrape, named
            urllib.request.urlopen(base + "/metrics", timeout=15)
        assert down.value.code == 502
    finally:
        relay.shutdown()
