"""Health checks: recorded LMCache/vLLM/NFS outputs and synthetic faults turned into codes, reports and exit status."""

import json
import os
import pathlib
import pwd
import subprocess
import tempfile
import time

import pytest

from kvtier.cluster import load_spec
from kvtier.health import checks, gather, report
from kvtier.nodes.target import Target
from kvtier.nodes.transport import Node
from kvtier.probes import health as h
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import nfs as nfs_probe
from tests.unit._cluster_data import spec_dict

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
EXPECT = {"model": "tiny", "adapters": {"l2": "resp", "l3": "fs"}, "p2p_peers": None}


def codes(found, status=None):
    return [(c["host"], c["tier"], c["code"]) for c in found if status is None or c["status"] == status]


def _probe(url):
    return lmcache_probe.probe_node({"lmcache_http": url, "lmcache_metrics": url + "/metrics", "vllm": url}, "tiny")


def test_a_healthy_spark(recorded_endpoints):
    url, _ = recorded_endpoints
    found = h.serving_checks("spark01", _probe(url), EXPECT)
    assert codes(found) == [
        ("spark01", "serving", "LMCACHE_OK"),
        ("spark01", "serving", "VLLM_OK"),
        ("spark01", "l2", "LMCACHE_ADAPTER_OK"),
        ("spark01", "l3", "LMCACHE_ADAPTER_OK"),
        ("spark01", "l0", "HIT_RATE"),
    ]
    assert all(c["status"] == h.OK for c in found)
    assert "resp adapter: 1 stores, 1 loads" in found[2]["reason"]


def test_lmcache_and_vllm_down_are_errors_and_the_counters_unverified():
    probe = lmcache_probe.probe_node(
        {
            "lmcache_http": "http://127.0.0.1:9",
            "lmcache_metrics": "http://127.0.0.1:9/metrics",
            "vllm": "http://127.0.0.1:9",
        }
    )
    found = h.serving_checks("spark02", probe, EXPECT)
    assert ("spark02", "serving", "LMCACHE_DOWN") in codes(found, h.ERR)
    assert ("spark02", "serving", "VLLM_DOWN") in codes(found, h.ERR)
    assert codes(found, h.UNVERIFIED) == [
        ("spark02", "l2", "LMCACHE_COUNTERS_UNAVAILABLE"),
        ("spark02", "l3", "LMCACHE_COUNTERS_UNAVAILABLE"),
        ("spark02", "l0", "LMCACHE_COUNTERS_UNAVAILABLE"),
    ]
    assert all(c["fix"] for c in found if c["status"] != h.OK)


def test_wrong_model_and_missing_adapter(recorded_endpoints):
    url, _ = recorded_endpoints
    found = h.serving_checks("spark01", _probe(url), {**EXPECT, "model": "Qwen/Qwen3-8B", "adapters": {"l2": "valkey"}})
    assert codes(found, h.ERR) == [
        ("spark01", "serving", "VLLM_MODEL_MISSING"),
        ("spark01", "l2", "LMCACHE_ADAPTER_MISSING"),
    ]


@pytest.mark.parametrize(
    "status, code",
    [
        ({"p2p_enabled": True, "p2p_state": "connecting", "p2p_peers": []}, "P2P_NOT_REGISTERED"),
        ({"p2p_enabled": True, "p2p_state": "registered", "p2p_peers": ["10.0.0.2:5555"]}, "P2P_PEER_MISSING"),
        ({"p2p_enabled": True, "p2p_state": "registered", "p2p_peers": ["a", "b"]}, "P2P_OK"),
    ],
)
def test_p2p(status, code):
    probe = {"lmcache_healthy": True, "lmcache_status": {"unhealthy": [], **status}}
    found = [c for c in h.serving_checks("spark01", probe, {**EXPECT, "p2p_peers": 2}) if c["tier"] == "l1_p2p"]
    assert [c["code"] for c in found] == [code]


def test_an_adapter_whose_stores_fail_is_named():
    def summary(fs, resp, stores, fs_stores=None):
        fs_stores = stores if fs_stores is None else fs_stores
        l2 = {"fs": {"stores": fs_stores, "usage_bytes": fs}, "resp": {"stores": stores, "usage_bytes": resp}}
        return {"l2": {**l2, "p2p": {"stores": stores, "usage_bytes": 0}}}

    chunk = 3_342_336  # one lab prompt's store
    assert h.store_gap_checks("spark01", summary(chunk, chunk, 1), EXPECT) == []
    # A busy node: resp is a store behind, and a second later it has caught up.
    busy = h.store_gap_checks(
        "spark01", summary(20 * chunk, 19 * chunk, 20), EXPECT, summary(21 * chunk, 21 * chunk, 21)
    )
    assert busy == []
    # Measured in the lab after the L2 server restarted: every store "completes", resp's bytes stand still.
    broken = summary(5 * chunk, chunk, 5)
    found = h.store_gap_checks("spark01", broken, EXPECT, broken)
    assert codes(found, h.ERR) == [("spark01", "l2", "L2_STORES_FAILING")]
    assert (
        f"resp adapter holds {chunk} bytes after 5 stores, where the busiest adapter holds {5 * chunk} after 5"
        in (found[0]["reason"])
    )
    # Measured in the lab after the bench emptied L2: resp stored the chunks again, while the shared L3 directory
    # already had them and fs skipped them (fewer stores, each of them whole): not a failure.
    refilled = summary(23 * chunk, 26 * chunk, 26, fs_stores=23)
    assert h.store_gap_checks("spark01", refilled, EXPECT, refilled) == []
    # Measured on a healthy lab: the shared L3's fs adapter completes as many store requests as resp but does not
    # write the chunks the other Spark already wrote. L3 is judged by its own checks, not by this one.
    for healthy in (summary(25_755_648, 27_852_800, 21), summary(16_842_752, 19_988_480, 17)):
        assert h.store_gap_checks("spark01", healthy, EXPECT, healthy) == []


def test_l2_as_lmcache_sees_it(redis_server):
    namespace = {}
    exec(compile(gather.SPARK_SOURCE, "spark-gather", "exec"), namespace)
    good = namespace["client_view"]("127.0.0.1", redis_server, "probe", "probe-password-1234567")
    assert "info" in good and good["ping_ms"] >= 0
    # The test server runs without maxmemory, which a cache must not.
    assert codes(h.l2_checks("spark01", good)) == [("spark01", "l2", "L2_NO_MAXMEMORY")]
    bounded = {**good, "info": {**good["info"], "maxmemory": 1 << 30}, "ping_ms": 0.3}
    assert codes(h.l2_checks("spark01", bounded)) == [("spark01", "l2", "L2_OK")]
    wrong = namespace["client_view"]("127.0.0.1", redis_server, "probe", "not-the-password-0000")
    assert codes(h.l2_checks("spark01", wrong), h.ERR) == [("spark01", "l2", "L2_AUTH")]
    down = namespace["client_view"]("127.0.0.1", 9, "probe", "x")
    assert codes(h.l2_checks("spark01", down), h.ERR) == [("spark01", "l2", "L2_DOWN")]
    full = h.l2_checks("s", {"info": {"used_memory": 99, "maxmemory": 100}, "ping_ms": 25.0})
    assert codes(full, h.WARN) == [("s", "l2", "L2_MEMORY_FULL"), ("s", "l2", "L2_LATENCY")]


def _lmcache_like(password):
    """A process holding the L2 login in its environment as kvtier's LMCache server does. It says when it runs:
    until its exec, /proc shows the parent's environment."""
    env = {"PATH": os.environ["PATH"], "LMCACHE_RESP_USERNAME": "probe", "LMCACHE_RESP_PASSWORD": password}
    proc = subprocess.Popen(["sh", "-c", "echo up; exec sleep 60"], env=env, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_lmcache_own_l2_login_is_tried_where_it_differs(redis_server, tmp_path):
    # A secrets file changed on one node: the inventory's login works, LMCache's is refused and every store to L2
    # fails with requests still succeeding. Only LMCache's own login shows it; the password is in no check.
    namespace = {}
    exec(compile(gather.SPARK_SOURCE, "spark-gather", "exec"), namespace)
    inventory = ("probe", "probe-password-1234567")

    def view(user, password):
        return namespace["client_view"]("127.0.0.1", redis_server, user, password)

    wrong, right = _lmcache_like("an-old-password-000000"), _lmcache_like(inventory[1])
    try:
        assert namespace["process_l2_login"](wrong.pid) == ("probe", "an-old-password-000000")
        assert namespace["lmcache_l2_view"](right.pid, inventory, view) is None  # the inventory's, already probed
        facts = {"l2": view(*inventory), "l2_lmcache": namespace["lmcache_l2_view"](wrong.pid, inventory, view)}
        found = h.spark_checks("spark02", facts, {"l2": True})
        assert codes(found, h.ERR) == [("spark02", "l2", "L2_AUTH")]
        assert "spark.yml --limit spark02" in next(c["fix"] for c in found if c["status"] == h.ERR)
        assert "an-old-password" not in json.dumps(found)
        # Without the inventory's password, LMCache's own login is the probe (no UNVERIFIED where it can be read).
        alone = {"l2_lmcache": namespace["lmcache_l2_view"](right.pid, (None, None), view)}
        assert [c["code"] for c in h.spark_checks("spark02", alone, {"l2": True})] == ["L2_NO_MAXMEMORY"]
    finally:
        for proc in (wrong, right):
            proc.kill()
            proc.wait()
            proc.stdout.close()
    assert namespace["lmcache_l2_view"](os.getpid(), inventory, view) is None  # no login in this environment
    # Not running (its unit refused to start): the login it starts with, from its secrets file as the role writes it.
    secrets = tmp_path / "lmcache-secrets.env"
    secrets.write_text(
        '# Ansible managed\nLMCACHE_RESP_PASSWORD="an-old-\\"pass\\$word"\nLMCACHE_RESP_USERNAME="probe"\n'
    )
    assert namespace["env_file_l2_login"](str(secrets)) == ("probe", 'an-old-"pass$word')
    stopped = namespace["lmcache_l2_view"](0, inventory, view, str(secrets))
    assert stopped["login_from"] == "file" and "auth_error" in stopped
    found = h.spark_checks("spark02", {"l2": view(*inventory), "l2_lmcache": stopped}, {"l2": True})
    assert "secrets file" in next(c["reason"] for c in found if c["code"] == "L2_AUTH")
    assert namespace["env_file_l2_login"](str(tmp_path / "missing.env")) is None
    assert codes(h.spark_checks("spark02", {}, {"l2": True})) == [("spark02", "l2", "L2_PASSWORD_UNKNOWN")]


def test_gatherers_run_as_one_script(recorded_endpoints, tmp_path):
    url, _ = recorded_endpoints
    namespace = {}
    exec(compile(gather.SPARK_SOURCE, "spark-gather", "exec"), namespace)
    summary = namespace["probe_node"]({"lmcache_metrics": url + "/metrics"})["lmcache"]
    assert summary["l2_store_requests_submitted"] == 2 and summary["l2"]["resp"]["stores"] == 1
    state = namespace["directory_state"](str(tmp_path))
    assert state["exists"] and state["writable"] and 0 < state["free_ratio"] <= 1
    assert namespace["running_service"]("kvtier-no-such.service")["active"] is False
    exec(compile(gather.STORAGE_SOURCE, "storage-gather", "exec"), {})


def test_a_spark_whose_services_are_stopped_is_named_not_unreachable():
    # The whole gather script runs (here, on this machine) with nothing listening: every fact is gathered, and the
    # checks name the stopped services, not an unreachable node.
    spark = sorted(spec_dict()["nodes"])[0]
    units = {"lmcache": "kvtier-no-such-lmcache.service", "vllm": "kvtier-no-such-vllm.service"}
    t = Target(spec=load_spec(spec_dict()), nodes={spark: Node(spark, [])}, units=units)
    facts = gather.spark(t, spark)
    assert "error" not in facts and facts["later"] is None
    found = codes(checks.spark_checks(t, spark, facts), h.ERR)
    assert (spark, "serving", "LMCACHE_DOWN") in found and (spark, "serving", "VLLM_DOWN") in found


def test_l3_directory(tmp_path):
    assert codes(h.l3_directory_checks("s", {"path": "/nope", "exists": False}), h.ERR) == [
        ("s", "l3", "L3_DIR_MISSING")
    ]
    read_only = {"path": "/x", "exists": True, "writable": True, "read_only": True, "free_ratio": 0.5}
    assert codes(h.l3_directory_checks("s", read_only), h.ERR) == [("s", "l3", "L3_READ_ONLY")]
    full = {"path": "/x", "exists": True, "writable": True, "read_only": False, "free_ratio": 0.01}
    assert codes(h.l3_directory_checks("s", full), h.ERR) == [("s", "l3", "L3_FULL")]
    assert codes(h.l3_directory_checks("s", h.directory_state(str(tmp_path))), h.OK) == [("s", "l3", "L3_OK")]


@pytest.mark.skipif(os.geteuid() != 0, reason="taking another process's identity needs root, as on a node")
def test_l3_writable_is_judged_as_the_lmcache_process_not_as_root():
    """The probe runs as root, which may write anywhere: a directory LMCache's user cannot write must still be
    L3_READ_ONLY. A real process running as nobody stands in for the LMCache server."""
    nobody_uid = pwd.getpwnam("nobody").pw_uid
    with tempfile.TemporaryDirectory() as base:  # under /tmp: nobody may reach it (pytest's tmp_path is 0700)
        os.chmod(base, 0o755)
        l3 = pathlib.Path(base) / "l3"
        l3.mkdir(mode=0o755)  # root's, not nobody's
        nobody = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "120"])
        try:
            # Until setpriv has taken nobody's identity (then it execs sleep).
            for _ in range(1000):
                if (h.process_credentials(nobody.pid) or (None,))[0] == nobody_uid:
                    break
                time.sleep(0.01)
            state = h.directory_state(str(l3), nobody.pid)
            assert (state["writable"], state["writable_as"]) == (False, f"process {nobody.pid}")
            (check,) = h.l3_directory_checks("spark01", state)
            assert (check["status"], check["code"]) == (h.ERR, "L3_READ_ONLY")
            assert f"checked as process {nobody.pid}" in check["reason"]
            assert os.access(l3, os.W_OK)  # what the probe saw before: root may write there
            l3.chmod(0o777)
            assert h.directory_state(str(l3), nobody.pid)["writable"] is True
            assert h.directory_state(str(l3), 2**22)["writable_as"] == "the probe's user"  # no such process
        finally:
            nobody.kill()
            nobody.wait()


def test_nfs_transport_from_recorded_mounts():
    def facts(kind):
        d = FIXTURES / "nfs" / kind
        return nfs_probe.describe("/mnt/kvcache", (d / "mounts").read_text(), (d / "mountstats").read_text())

    rdma = h.nfs_checks("spark01", facts("rdma"))
    # Recorded over soft-RoCE with the kernel's default 256 KiB transfers.
    assert codes(rdma) == [("spark01", "l3", "L3_RSIZE_SMALL")]
    assert ("spark01", "l3", "L3_NOT_RDMA") in codes(h.nfs_checks("spark01", facts("tcp")), h.ERR)
    assert codes(h.nfs_checks("spark01", {"mounted": False}), h.ERR) == [("spark01", "l3", "L3_NOT_MOUNTED")]
    assert codes(h.nfs_checks("spark01", None, rdma_expected=False), h.UNVERIFIED) == [
        ("spark01", "fabric", "L3_NO_FABRIC")
    ]


def test_array(tmp_path):
    healthy = {
        "md127": {
            "md_name": "host:kvcache",
            "health": "healthy",
            "device": "/dev/md127",
            "level": "raid0",
            "raid_disks": 8,
            "member_serials": ["A"],
            "mounts": [{"target": "/srv/kvcache"}],
        }
    }
    mount = {"path": "/srv/kvcache", "exists": True, "writable": True, "free_ratio": 0.05}
    assert codes(h.array_checks("st", healthy, "kvcache", mount)) == [
        ("st", "storage", "ARRAY_OK"),
        ("st", "storage", "XFS_FULL"),
    ]
    broken = {"md127": {**healthy["md127"], "health": "broken", "missing_serials": ["LAB0000004"], "mounts": []}}
    found = h.array_checks("st", broken, "kvcache", None)
    assert codes(found, h.ERR) == [("st", "storage", "ARRAY_DEGRADED"), ("st", "storage", "XFS_NOT_MOUNTED")]
    assert "LAB0000004" in found[0]["reason"]
    assert codes(h.array_checks("st", {}, "kvcache", None)) == [("st", "storage", "ARRAY_MISSING")]
    # The mount whose free space is checked is the named array's, not any array's.
    other = {"md126": {"md_name": "host:scratch", "mounts": [{"target": "/"}]}}
    mounted = {**other, "md127": {**healthy["md127"], "mounts": [{"target": str(tmp_path)}]}}
    assert h.array_mount_state(mounted, "kvcache")["path"] == str(tmp_path)
    assert h.array_mount_state(other, "kvcache") is None


def _running(chunk="256", model="/opt/kvtier/models/Qwen3-8B"):
    from kvtier.cluster import fingerprint

    spec = load_spec(spec_dict())
    return {
        "lmcache": {
            "argv": ["lmcache", "server", "--chunk-size", chunk, "--hash-algorithm", "blake3"],
            "env": {"KVTIER_FINGERPRINT": fingerprint(spec)},
        },
        "vllm": {"argv": ["python", "--model", model, "--dtype", "bfloat16", "--block-size", "16"]},
    }


def test_config_drift_names_the_setting_and_the_node():
    t = Target(spec=load_spec(spec_dict()), nodes={})
    facts = {"spark01": _running(), "spark02": _running(chunk="128"), "spark03": {"error": "unreachable"}}
    found = checks.config_checks(t, facts)
    assert codes(found) == [("spark01", "config", "CONFIG_OK"), ("spark02", "config", "CONFIG_DRIFT_CHUNK")]
    assert "lmcache --chunk-size is 128 here, 256 in kvtier_cluster (spark01 256)" in found[1]["reason"]
    moved = checks.config_checks(t, {"spark01": _running(model="/srv/other")})
    assert codes(moved, h.ERR) == [("spark01", "config", "CONFIG_DRIFT_MODEL")]


def test_a_check_keeps_its_identity_whatever_its_state(recorded_endpoints):
    """One metric series per check: a Spark whose LMCache and vLLM are down reports the same checks as a healthy
    one, each under the name of what it checks, not of what it found."""
    url, _ = recorded_endpoints
    healthy = h.serving_checks("spark01", _probe(url), EXPECT)
    nothing = "http://127.0.0.1:9"
    down = h.serving_checks(
        "spark01",
        lmcache_probe.probe_node({"lmcache_http": nothing, "lmcache_metrics": nothing + "/metrics", "vllm": nothing}),
        EXPECT,
    )

    def series(found):
        return sorted({(c["tier"], c["check"]) for c in found})

    assert series(healthy) == series(down)
    assert series(healthy) == [
        ("l0", "hit"),
        ("l2", "adapter"),
        ("l3", "adapter"),
        ("serving", "lmcache"),
        ("serving", "vllm"),
    ]
    assert {c["code"] for c in healthy}.isdisjoint({c["code"] for c in down})


def test_report_table_json_and_prometheus(tmp_path):
    found = [
        h.check("spark01", "l2", h.OK, "L2_OK", "fine", name="l2"),
        h.check("spark02", "l2", h.ERR, "L2_AUTH", "cannot log in", "fix the password", name="l2"),
        h.check("spark02", "l2", h.WARN, "L2_LATENCY", "slow", "look at the link", name="l2"),
    ]
    table = report.table(found).splitlines()
    assert table[1].split()[:4] == ["spark02", "l2", "ERR", "L2_AUTH"] and "fix: fix the password" in table[2]
    assert table[-1] == "3 checks: 1 OK, 1 WARN, 1 ERR, 0 UNVERIFIED"
    assert h.exit_status(found) == 1 and h.exit_status(found[:1]) == 0
    assert set(json.loads(json.dumps(found))[0]) == {"host", "tier", "check", "status", "code", "reason", "fix"}
    facts = {
        "spark01": {
            "probe": {
                "lmcache": {
                    "requested_tokens": 10,
                    "l1_hit_tokens": 4,
                    "l2_hit_tokens": 2,
                    "l2": {"resp": {"loads": 3}},
                }
            }
        }
    }
    text = report.prometheus(found, facts, now=1765000000)
    # One series per check, its worst result; the code beside it in an info series.
    assert [line for line in text.splitlines() if line.startswith("kvtier_health_")] == [
        'kvtier_health_status{host="spark01",tier="l2",check="l2"} 0',
        'kvtier_health_status{host="spark02",tier="l2",check="l2"} 2',
        'kvtier_health_code_info{host="spark01",tier="l2",check="l2",code="L2_OK",status="OK"} 1',
        'kvtier_health_code_info{host="spark02",tier="l2",check="l2",code="L2_AUTH",status="ERR"} 1',
        "kvtier_health_last_run_timestamp_seconds 1765000000.000",
    ]
    assert 'kvtier_hit_tokens_total{host="spark01",tier="l0"} 4' in text
    assert 'kvtier_tier_loads_total{host="spark01",adapter="resp"} 3' in text
    path = tmp_path / "textfile" / "kvtier.prom"
    report.write_textfile(str(path), text)
    assert path.read_text() == text and not list(path.parent.glob(".kvtier-health.*"))
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")


def _run_module(args, capsys):
    import kvtier_health
    from ansible.module_utils.testing import patch_module_args

    with patch_module_args(args), pytest.raises(SystemExit):
        kvtier_health.main()
    return json.loads(capsys.readouterr().out)


def test_module_on_a_healthy_spark_reports_every_check(recorded_endpoints, tmp_path, capsys):
    url, _ = recorded_endpoints
    endpoints = {"vllm": url, "lmcache_http": url, "lmcache_metrics": url + "/metrics"}
    out = _run_module(
        {
            "name": "spark01",
            "endpoints": endpoints,
            "model": "tiny",
            "adapters": {"l2": "resp", "l3": "fs"},
            "l3_path": str(tmp_path),
            "rdma_fabric": False,
            "_ansible_check_mode": True,
        },
        capsys,
    )
    assert not out.get("failed") and out["changed"] is False
    assert ("spark01", "l3", "L3_OK") in codes(out["checks"]) and out["counts"]["ERR"] == 0
    assert ("spark01", "fabric", "L3_NO_FABRIC") in codes(out["checks"], h.UNVERIFIED)


def test_module_fails_listing_every_error(capsys):
    endpoints = {"vllm": "http://127.0.0.1:9", "lmcache_http": "http://127.0.0.1:9"}
    out = _run_module({"name": "spark02", "endpoints": endpoints, "model": "tiny"}, capsys)
    assert out["failed"] and out["msg"].startswith("2 check(s) ERR: spark02 serving LMCACHE_DOWN")
    assert "VLLM_DOWN" in out["msg"] and "(fix: " in out["msg"]
    assert codes(out["checks"]) == [
        ("spark02", "serving", "LMCACHE_DOWN"),
        ("spark02", "serving", "VLLM_DOWN"),
        ("spark02", "l0", "LMCACHE_COUNTERS_UNAVAILABLE"),
    ]
    out = _run_module({"name": "spark02", "endpoints": endpoints, "fail_on_error": False}, capsys)
    assert not out.get("failed") and out["counts"]["ERR"] == 2


def test_module_tolerates_only_the_codes_it_is_given(capsys):
    # A repair play tolerates the faults it repairs; every other ERR still fails the task.
    endpoints = {"vllm": "http://127.0.0.1:9", "lmcache_http": "http://127.0.0.1:9"}
    args = {"name": "spark02", "endpoints": endpoints, "model": "tiny"}
    out = _run_module({**args, "tolerate": ["VLLM_DOWN"]}, capsys)
    assert out["failed"] and out["msg"].startswith("1 check(s) ERR: spark02 serving LMCACHE_DOWN")
    assert [c["code"] for c in out["tolerated"]] == ["VLLM_DOWN"]
    out = _run_module({**args, "tolerate": ["VLLM_DOWN", "LMCACHE_DOWN"]}, capsys)
    assert not out.get("failed") and out["counts"]["ERR"] == 2 and len(out["tolerated"]) == 2


def test_the_mount_that_holds_the_l3_path():
    mounts = "/dev/sda1 / ext4 rw 0 0\nsrv:/srv/kvcache /mnt/kvcache nfs4 rw,proto=rdma 0 0\n"
    assert nfs_probe.mount_point_of("/mnt/kvcache/lmcache", mounts) == "/mnt/kvcache"
    assert nfs_probe.mount_point_of("/mnt/kvcache", mounts) == "/mnt/kvcache"
    assert nfs_probe.mount_point_of("/mnt/kvcachex/lmcache", mounts) == "/"


def test_an_l2_server_younger_than_lmcache_is_named():
    import os
    import time

    started = h.process_started_at(os.getpid())
    assert started is not None and time.time() - 86400 * 365 < started <= time.time()
    now = 1_000_000.0
    l2 = {"info": {"uptime_in_seconds": "60"}, "observed_at": now}
    # LMCache up for an hour, L2 for a minute: the resp adapter's connection is gone for good.
    found = h.l2_restart_checks("spark01", l2, {"started_at": now - 3600}, "resp")
    assert codes(found, h.ERR) == [("spark01", "l2", "L2_RESTARTED_UNDER_LMCACHE")]
    assert "started 3540 s after" in found[0]["reason"] and "repair_lmcache.yml" in found[0]["fix"]
    # L2 older than LMCache (or within the clock margin), or an adapter that reconnects: nothing to say.
    assert h.l2_restart_checks("spark01", l2, {"started_at": now - 50}, "resp") == []
    assert h.l2_restart_checks("spark01", l2, {"started_at": now - 3600}, "valkey") == []
    assert h.l2_restart_checks("spark01", {}, {"started_at": now}, "resp") == []


# --- the RoCE fabric ---------------------------------------------------------------------------------------------


def _nic(mtu=9000, operstate="up", rdma=(("rocep1s0f0", 1, "ACTIVE"),)):
    links = [{"device": d, "port": p, "state": s} for d, p, s in rdma]
    return {"exists": True, "operstate": operstate, "mtu": mtu, "rdma": links}


def test_fabric_every_interface_up_at_the_mtu_with_an_active_rdma_link():
    state = {
        "rdma_error": None,
        "interfaces": {"enp1s0f0np0": _nic(), "enP2p1s0f0np0": _nic(rdma=(("roceP2p1s0f0", 1, "ACTIVE"),))},
    }
    found = h.fabric_checks("spark01", state, 9000)
    assert codes(found, h.OK) == [("spark01", "fabric", "FABRIC_OK")] * 2
    assert found[1]["reason"] == "rocep1s0f0/1 ACTIVE on enp1s0f0np0, MTU 9000"


def test_fabric_faults_each_named():
    state = {
        "rdma_error": None,
        "interfaces": {
            "a": {"exists": False},
            "b": _nic(mtu=1500),
            "c": _nic(operstate="down", rdma=(("mlx5_2", 1, "DOWN"),)),
            "d": _nic(rdma=()),
        },
    }
    found = h.fabric_checks("kv-storage01", state, 9000)
    assert codes(found, h.ERR) == [
        ("kv-storage01", "fabric", "FABRIC_NETDEV_MISSING"),
        ("kv-storage01", "fabric", "FABRIC_MTU"),
        ("kv-storage01", "fabric", "FABRIC_LINK_DOWN"),
        ("kv-storage01", "fabric", "FABRIC_RDMA_DOWN"),
        ("kv-storage01", "fabric", "FABRIC_NO_RDMA"),
    ]
    assert "b has MTU 1500, the fabric's is 9000" in found[1]["reason"]
    assert "mlx5_2/1 DOWN" in found[3]["reason"]
    assert codes(h.fabric_checks("s", None, 9000), h.UNVERIFIED) == [("s", "fabric", "FABRIC_UNKNOWN")]
    # Without the rdma tool the link is unverified, not down.
    unread = h.fabric_checks("s", {"rdma_error": "No such file", "interfaces": {"d": _nic(rdma=())}}, 9000)
    assert codes(unread, h.UNVERIFIED) == [("s", "fabric", "FABRIC_NO_RDMA")] and "No such file" in unread[0]["reason"]


def test_fabric_state_reads_the_node(monkeypatch):
    state = h.fabric_state(["lo", "kvtier-no-such-nic"])
    assert state["interfaces"]["kvtier-no-such-nic"] == {"exists": False}
    lo = state["interfaces"]["lo"]
    assert lo["exists"] and lo["mtu"] == int(open("/sys/class/net/lo/mtu").read()) and lo["rdma"] == []


def test_nfs_io_size_checks_rsize_and_wsize():
    facts = {
        "mounted": True,
        "proto": "rdma",
        "xprt": "rdma",
        "vers": "4.2",
        "options": {"rsize": "1048576", "wsize": "262144"},
    }
    found = h.nfs_checks("spark01", facts)
    assert codes(found, h.WARN) == [("spark01", "l3", "L3_RSIZE_SMALL")] and "wsize 262144" in found[0]["reason"]
    assert codes(h.nfs_checks("spark01", facts, io_size=262144), h.OK) == [("spark01", "l3", "L3_RDMA_OK")]


def test_module_checks_the_fabric_of_the_storage_node(capsys, monkeypatch):
    import kvtier_health

    monkeypatch.setattr(kvtier_health, "collect", lambda: {"md_arrays": {}})
    out = _run_module(
        {
            "name": "kv-storage01",
            "array_name": "kvcache",
            "data_interfaces": ["lo"],
            "mtu": 9000,
            "fail_on_error": False,
        },
        capsys,
    )
    found = [c for c in out["checks"] if c["tier"] == "fabric"]
    assert [c["code"] for c in found if c["status"] == h.ERR][0] == "FABRIC_MTU"


# --- the P2P coordinator -----------------------------------------------------------------------------------------


@pytest.fixture
def coordinator_answering():
    """A local HTTP server answering GET /instances with whatever the test sets (stands in for the coordinator)."""
    import http.server
    import threading

    answer = {"body": "[]"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = answer["body"].encode()
            self.send_response(200 if self.path == "/instances" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", answer
    httpd.shutdown()


SPARKS = {"spark01": "10.10.0.21", "spark02": "10.10.0.22"}


def test_the_coordinator_lists_every_spark(coordinator_answering):
    url, answer = coordinator_answering
    answer["body"] = json.dumps(
        [
            {"instance_id": "spark01", "ip": "10.10.0.21", "mq_port": 5555},
            {"instance_id": "spark02", "ip": "10.10.0.22", "mq_port": 5555},
        ]
    )
    found = h.coordinator_checks("spark01", h.coordinator_state(url), SPARKS)
    assert codes(found, h.OK) == [("spark01", "l1_p2p", "P2P_COORDINATOR_OK")]
    # The same answer keyed by instance id.
    answer["body"] = json.dumps({"instances": {"spark01": {"ip": "10.10.0.21"}, "spark02": {"ip": "10.10.0.22"}}})
    assert codes(h.coordinator_checks("spark01", h.coordinator_state(url), SPARKS), h.OK)


def test_a_missing_and_a_stale_instance_are_named(coordinator_answering):
    url, answer = coordinator_answering
    answer["body"] = json.dumps(
        [{"instance_id": "spark01", "ip": "10.10.0.99"}, {"instance_id": "old", "ip": "10.1.1.1"}]
    )
    found = h.coordinator_checks("spark01", h.coordinator_state(url), SPARKS)
    assert codes(found) == [
        ("spark01", "l1_p2p", "P2P_COORDINATOR_MISSING"),
        ("spark01", "l1_p2p", "P2P_COORDINATOR_STALE"),
    ]
    assert found[0]["reason"].startswith("spark02 not registered")
    assert "old (10.1.1.1)" in found[1]["reason"] and "spark01 (10.10.0.99)" in found[1]["reason"]


def test_a_coordinator_that_does_not_answer():
    found = h.coordinator_checks("spark01", h.coordinator_state("http://127.0.0.1:9", timeout=2), SPARKS)
    assert codes(found, h.ERR) == [("spark01", "l1_p2p", "P2P_COORDINATOR_DOWN")]


def _running_lmcache(*adapters):
    argv = ["/opt/kvtier/venv/bin/lmcache", "server"]
    for adapter in adapters:
        argv += ["--l2-adapter", json.dumps(adapter)]
    return {"active": True, "argv": argv}


def test_load_order_warns_when_a_slower_tier_is_looked_up_first():
    spec = load_spec(spec_dict())
    expect = checks.expectations(Target(spec=spec, nodes={}), "spark01")
    assert expect["load_order"]["fastest_first"] == ["l3", "l2"]
    fs, resp = {"type": "fs", "base_path": "/mnt"}, {"type": "resp", "host": "10.10.0.10"}
    [fine] = h.load_order_checks("spark01", _running_lmcache(fs, resp), expect)
    assert (fine["status"], fine["code"]) == (h.OK, "LOAD_ORDER_OK")
    [late] = h.load_order_checks("spark01", _running_lmcache(resp, fs), expect)
    assert (late["status"], late["code"], late["tier"]) == (h.WARN, "LOAD_ORDER_SLOW_FIRST", "config")
    assert late["reason"].startswith("LMCache looks in l2 before l3, which loads a chunk faster (l3 4.36 ms, l2 28 ms")
    assert "load_order.tiers" in late["fix"]
    # A valkey adapter's JSON carries its login: only its type is read, and nothing of it is shown.
    valkey = {"type": "valkey", "password": "do-not-show-this-password"}
    with_valkey = {**expect, "adapters": {"l3": "fs", "l2": "valkey"}}
    [shown] = h.load_order_checks("spark01", _running_lmcache(valkey, fs), with_valkey)
    assert shown["code"] == "LOAD_ORDER_SLOW_FIRST" and "do-not-show" not in json.dumps(shown)
    # One lower tier, or LMCache not running: nothing to order.
    assert h.load_order_checks("spark01", {"active": False}, expect) == []
    one = checks.expectations(Target(spec=load_spec(spec_dict(tiers=["l0", "l3"])), nodes={}), "spark01")
    assert h.load_order_checks("spark01", _running_lmcache(fs), one) == []
