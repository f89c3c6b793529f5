"""Canaries (`kvtier health --canary`): each tier proven with the canary's own entries removed from the tiers above
it, a tier that fails named on the right Spark, and nothing left behind.

LMCache and vLLM cannot run in a unit test: each Spark here is a stand-in (named so) that answers vLLM's
/v1/completions and LMCache's /metrics and DELETE /cache/objects over real HTTP on loopback, and looks a request up
as LMCache does (its DRAM, then each L2 adapter in the rendered order, then p2p). Its L3 is a real directory of fs-style
files and the canary's probes run as real node-side Python. The lab runs the canaries against the real servers."""

import hashlib
import http.server
import json
import threading

import pytest

from kvtier.cluster import load_spec
from kvtier.nodes import transport as nodes
from kvtier.nodes.target import Target
from kvtier.probes import health as h
from kvtier.probes import lmcache
from kvtier.proof import canary
from tests.unit._cluster_data import spec_dict

CHUNK = 32
CHUNK_BYTES = 32768  # one chunk's KV, the same on every adapter


class Cluster:
    """The shared tiers of the stand-in cluster: L2 (a set of keys) and L3 (files in a directory)."""

    def __init__(self, l3_dir):
        self.l2, self.l3_dir, self.sparks = set(), l3_dir, {}
        self.order = ("fs", "resp")  # the lower tiers' adapters in the order the spec renders them

    def l3_has(self, key):
        return (self.l3_dir / f"tiny@0x01000000@0@{key[0]}@{key[1]}.data").exists()


class StandInSpark:
    """One Spark's vLLM + LMCache, as far as a canary sees them. l2_broken: its resp adapter neither stores nor loads
    (LMCache's adapter after the L2 server restarted); p2p_broken: its peer lookups find nothing."""

    def __init__(self, name, cluster, l2_broken=False, p2p_broken=False):
        self.name, self.cluster = name, cluster
        self.l2_broken, self.p2p_broken = l2_broken, p2p_broken
        self.wrong_from = None  # an adapter whose loads make the answer differ (KV that is not what it computes)
        self.loads_every_tier = False  # counts a load on every lower tier that holds the prompt, not the first only
        self.dram = set()
        self.counters = {"l1_hit": 0, "loads": {"resp": 0, "fs": 0, "p2p": 0}, "stores": {"resp": 0, "fs": 0}}
        # Bytes each adapter holds as this server counts them: what it stored, less what was removed through it.
        self.usage = {"resp": 0, "fs": 0}
        self.requests = []
        self.lock = threading.Lock()

    def keys(self, prompt, salt):
        tokens = len(prompt) // 3  # the stand-in's tokenizer: three characters a token
        digest = [
            hashlib.sha256(f"{prompt[: (i + 1) * CHUNK * 3]}".encode()).hexdigest() for i in range(tokens // CHUNK)
        ]
        return tokens, [(d, salt) for d in digest]

    def complete(self, prompt, salt):
        with self.lock:
            self.requests.append(salt)
            tokens, keys = self.keys(prompt, salt)
            peers = [s for s in self.cluster.sparks.values() if s is not self]
            lower = {
                "resp": lambda k: not self.l2_broken and k in self.cluster.l2,
                "fs": self.cluster.l3_has,
            }
            tiers = [
                ("dram", lambda k: k in self.dram),
                *((name, lower[name]) for name in self.cluster.order),
                ("p2p", lambda k: not self.p2p_broken and any(k in p.dram for p in peers)),
            ]
            cached, found, served_by = 0, 0, None
            for tier, has in tiers:
                if keys and has(keys[0]):
                    found = next((i for i, k in enumerate(keys) if not has(k)), len(keys))
                    cached = found * CHUNK
                    if tier == "dram":
                        self.counters["l1_hit"] += cached
                    else:
                        self.counters["loads"][tier] += 1
                        if self.loads_every_tier:
                            for other, has_other in tiers:
                                if other not in ("dram", "p2p", tier) and has_other(keys[0]):
                                    self.counters["loads"][other] += 1
                    served_by = tier
                    break
            self.dram.update(keys)
            new = keys[found:]  # LMCache stores the chunks no tier served, not what it loaded
            if new and not self.l2_broken:
                self.cluster.l2.update(new)
                self.counters["stores"]["resp"] += 1
                self.usage["resp"] += CHUNK_BYTES * len(new)
            for digest, key_salt in new:
                (self.cluster.l3_dir / f"tiny@0x01000000@0@{digest}@{key_salt}.data").write_bytes(b"kv")
            if new:
                self.counters["stores"]["fs"] += 1
                self.usage["fs"] += CHUNK_BYTES * len(new)
            # A greedy answer of four tokens, each well ahead of the next best; another one from a wrong cache.
            answer = ["x", "y", "z", "z"] if served_by and served_by == self.wrong_from else ["a", "b", "c", "d"]
            logprobs = {"tokens": answer, "top_logprobs": [{t: -0.1, "q": -2.5} for t in answer]}
            return {
                "usage": {"prompt_tokens": tokens, "prompt_tokens_details": {"cached_tokens": cached}},
                "choices": [{"text": "".join(answer), "logprobs": logprobs}],
            }

    def metrics(self):
        c = self.counters
        lines = [f"lmcache_mp_lookup_hit_l1_tokens_total {c['l1_hit']}"]
        lines += [f'lmcache_mp_l2_load_completed_requests_total{{l2_name="{a}"}} {n}' for a, n in c["loads"].items()]
        lines += [f'lmcache_mp_l2_store_completed_requests_total{{l2_name="{a}"}} {n}' for a, n in c["stores"].items()]
        lines += [f'lmcache_mp_l2_usage_bytes{{l2_name="{a}"}} {n}' for a, n in self.usage.items()]
        return "\n".join(lines) + "\n"

    def delete(self, body):
        keys = {(k["chunk_hash_hex"], k["cache_salt"]) for k in body["keys"]}
        with self.lock:
            if body["tier"] == "l1":
                self.dram -= keys
            elif body.get("adapter") == "resp":
                if self.l2_broken:
                    return {"deleted": 0, "skipped": 0, "ok": False, "error": "not connected"}
                self.usage["resp"] -= CHUNK_BYTES * len(keys & self.cluster.l2)
                self.cluster.l2 -= keys
            elif body.get("adapter") == "fs":
                for digest, salt in keys:
                    path = self.cluster.l3_dir / f"tiny@0x01000000@0@{digest}@{salt}.data"
                    self.usage["fs"] -= CHUNK_BYTES if path.exists() else 0
                    path.unlink(missing_ok=True)
        return {"deleted": len(keys), "skipped": 0, "ok": True}

    def handler(self):
        spark = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, status, body, kind="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def do_GET(self):  # noqa: N802
                self._reply(200, spark.metrics(), "text/plain")

            def do_POST(self):  # noqa: N802
                body = self._body()
                self._reply(200, spark.complete(body["prompt"], body.get("cache_salt", "")))

            def do_DELETE(self):  # noqa: N802
                self._reply(200, spark.delete(self._body()))

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def cluster(tmp_path, request):
    """Two stand-in Sparks on loopback, with the lower tiers in the planner's order (L3 first) and with L2 first; the
    test sets their faults before the canaries run."""
    shared = Cluster(tmp_path / "l3")
    shared.l3_dir.mkdir()
    servers, ports = [], {}
    for name in ("spark01", "spark02"):
        spark = shared.sparks[name] = StandInSpark(name, shared)
        for role in ("vllm_http", "lmcache_http"):
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), spark.handler())
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
            ports.setdefault(name, {})[role] = server.server_port
    data = spec_dict(
        lmcache={"chunk_size": CHUNK, "l0_dram_gib": 1},
        l3={"adapter": "fs", "path": str(shared.l3_dir)},
        nodes={name: {"data_address": f"10.10.0.2{i}", "ports": ports[name]} for i, name in enumerate(ports, 1)},
        **({"load_order": {"tiers": request.param}} if getattr(request, "param", None) else {}),
    )
    shared.target = Target(spec=load_spec(data), nodes={n: nodes.local(n) for n in ports})
    shared.order = tuple(adapter for _, adapter in shared.target.lower_tiers)
    yield shared
    for server in servers:
        server.shutdown()


def by_tier(results, host):
    return {c["tier"]: c for c in results if c["host"] == host}


@pytest.mark.parametrize("cluster", [None, ["l2", "l3"]], ids=["planned-order", "l2-first"], indirect=True)
def test_every_tier_of_every_spark_is_proven_and_nothing_else_is_touched(cluster):
    client = ("c" * 64, "")  # a client's entry in every tier: the canaries must leave it alone
    cluster.l2.add(client)
    cluster.sparks["spark01"].dram.add(client)
    (cluster.l3_dir / f"tiny@0x01000000@0@{'c' * 64}.data").write_bytes(b"a client's")
    results = canary.Canary(cluster.target, out=lambda _: None).run()
    lower = [tier for tier, _ in cluster.target.lower_tiers]
    assert [(c["host"], c["tier"], c["code"]) for c in results] == [
        *((host, tier, f"CANARY_{tier.upper()}_OK") for host in ("spark01", "spark02") for tier in ("l0", *lower)),
        ("spark01", "l1_p2p", "CANARY_P2P_OK"),
        ("spark02", "l1_p2p", "CANARY_P2P_OK"),
    ]
    assert all(c["status"] == h.OK for c in results)
    assert "from spark02" in by_tier(results, "spark01")["l1_p2p"]["reason"]
    # The canaries' entries are gone from every tier, the client's are all there; every request carried a salt.
    assert cluster.l2 == {client} and cluster.sparks["spark01"].dram == {client}
    assert not cluster.sparks["spark02"].dram
    assert [p.name for p in cluster.l3_dir.iterdir()] == [f"tiny@0x01000000@0@{'c' * 64}.data"]
    assert all(salt.startswith("kvtier-canary-") for s in cluster.sparks.values() for salt in s.requests)
    # Each server's adapters still agree on the bytes they hold: health after the canaries names no black hole.
    for name, spark in cluster.sparks.items():
        summary = lmcache.lmcache_summary(lmcache.parse_prometheus(spark.metrics()))
        assert spark.usage == {"resp": 0, "fs": 0}
        assert h.store_gap_checks(name, summary, {"adapters": {"l2": "resp", "l3": "fs"}}) == []


def test_a_broken_l2_adapter_is_named_on_its_spark_and_the_rest_still_proven(cluster):
    cluster.sparks["spark02"].l2_broken = True
    results = canary.Canary(cluster.target, out=lambda _: None, store_timeout=2).run()
    broken = by_tier(results, "spark02")
    assert broken["l2"]["status"] == h.ERR and broken["l2"]["code"] == "CANARY_L2_NOT_STORED"
    assert "repair_lmcache.yml" in broken["l2"]["fix"]
    # Its L3 cannot be shown while its L2 entries cannot be removed first: said so, never a false miss.
    assert broken["l3"]["code"] == "CANARY_L3_OK" or broken["l3"]["status"] == h.UNVERIFIED
    assert {c["code"] for c in results if c["host"] == "spark01"} == {
        "CANARY_L0_OK",
        "CANARY_L2_OK",
        "CANARY_L3_OK",
        "CANARY_P2P_OK",
    }


def test_a_tier_that_answers_differently_from_the_cold_computation_is_an_error(cluster):
    cluster.sparks["spark01"].wrong_from = "fs"
    results = canary.Canary(cluster.target, out=lambda _: None).run()
    wrong = by_tier(results, "spark01")["l3"]
    assert (wrong["status"], wrong["code"]) == (h.ERR, "CANARY_L3_WRONG_ANSWER")
    assert "token 1 is 'x' where the cold computation gave 'a'" in wrong["reason"]
    assert by_tier(results, "spark01")["l2"]["code"] == "CANARY_L2_OK"
    assert by_tier(results, "spark02")["l3"]["code"] == "CANARY_L3_OK"


def test_a_tier_looked_up_later_that_loads_too_is_an_error(cluster):
    cluster.sparks["spark02"].loads_every_tier = True
    results = canary.Canary(cluster.target, out=lambda _: None).run()
    first = by_tier(results, "spark02")["l3"]
    assert (first["status"], first["code"]) == (h.ERR, "CANARY_L3_NOT_FIRST")
    assert "also loaded from resp (1 loads), looked up after it" in first["reason"]
    assert by_tier(results, "spark02")["l2"]["code"] == "CANARY_L2_OK"  # the last tier has none after it
    assert by_tier(results, "spark01")["l3"]["code"] == "CANARY_L3_OK"


def test_a_peer_that_serves_nothing_is_a_p2p_miss_on_the_spark_that_asked(cluster):
    cluster.sparks["spark01"].p2p_broken = True
    results = canary.Canary(cluster.target, out=lambda _: None).run()
    miss = by_tier(results, "spark01")["l1_p2p"]
    assert miss["status"] == h.ERR and miss["code"] == "CANARY_P2P_MISS"
    assert "from spark02" in miss["reason"] and "0 tokens cached" in miss["reason"]
    assert by_tier(results, "spark02")["l1_p2p"]["code"] == "CANARY_P2P_OK"


def test_a_spark_that_does_not_answer_is_unverified_not_ok(cluster):
    cluster.target.spec = load_spec(
        {
            **spec_dict(
                lmcache={"chunk_size": CHUNK, "l0_dram_gib": 1},
                l3={"adapter": "fs", "path": str(cluster.l3_dir)},
            ),
            "nodes": {"spark01": {"data_address": "10.10.0.21", "ports": {"vllm_http": 1, "lmcache_http": 2}}},
            "p2p": {"coordinator": {"node": "spark01", "port": 9300}, "advertise_port": 8500},
        }
    )
    cluster.target.nodes = {"spark01": nodes.local("spark01")}
    results = canary.Canary(cluster.target, out=lambda _: None).run()
    assert {c["status"] for c in results} == {h.UNVERIFIED}
    assert {c["tier"] for c in results} == {"l0", "l2", "l3"}
    assert all(c["code"] == "CANARY_NOT_RUN" for c in results)


def run_module(capsys, check_mode=False, **params):
    import kvtier_canary
    from ansible.module_utils.testing import patch_module_args

    with patch_module_args({"_ansible_check_mode": check_mode, **params}), pytest.raises(SystemExit):
        kvtier_canary.main()
    return json.loads(capsys.readouterr().out)


def test_the_module_proves_a_p2p_transfer_as_the_rolling_restart_does(cluster, capsys):
    t = cluster.target
    salt = "kvtier-canary-p2p-0123456789abcdef0123"
    source = {"lmcache_http": t.lmcache_url("spark02"), "salt": salt}
    planted = run_module(
        capsys,
        action="plant",
        vllm_url=t.vllm_url("spark02"),
        model="tiny",
        chunk_size=CHUNK,
        persistent_adapters=["resp", "fs"],
        l3_path=str(cluster.l3_dir),
        **source,
    )["canary"]
    assert planted["late"] == [] and len(planted["keys"]) == planted["wanted"] > 0
    keys = planted["keys"]
    removed = run_module(capsys, action="forget", keys=keys, tier="l2", persistent_adapters=["resp", "fs"], **source)
    assert removed["changed"] and not cluster.l2 and not list(cluster.l3_dir.iterdir())
    target = {"lmcache_http": t.lmcache_url("spark01"), "salt": salt}
    served = run_module(
        capsys, action="serve", vllm_url=t.vllm_url("spark01"), model="tiny", prompt=planted["prompt"], **target
    )["canary"]
    assert served["loads"]["p2p"] == 1 and served["reply"]["cached_tokens"] == len(keys) * CHUNK
    for spark in (source, target):
        run_module(capsys, action="forget", keys=keys, tier="l1", **spark)
    assert not any(s.dram for s in cluster.sparks.values())


def test_the_module_refuses_a_salt_lmcache_would_refuse_and_sends_nothing_in_check_mode(cluster, capsys):
    t = cluster.target
    common = {"lmcache_http": t.lmcache_url("spark01"), "vllm_url": t.vllm_url("spark01"), "model": "tiny"}
    refused = run_module(capsys, action="plant", salt="a/b", chunk_size=CHUNK, **common)
    assert refused["failed"] and "1-128 characters" in refused["msg"]
    missing = run_module(capsys, action="serve", salt="kvtier-canary-x", **common)
    assert missing["failed"] and "needs prompt" in missing["msg"]
    checked = run_module(capsys, check_mode=True, action="plant", salt="kvtier-canary-x", chunk_size=CHUNK, **common)
    assert checked["changed"] is False and not cluster.sparks["spark01"].requests


def test_with_one_serving_spark_the_p2p_canary_says_why_it_did_not_run(cluster):
    results = canary.Canary(cluster.target, out=lambda _: None).run(["spark02"])
    assert {c["host"] for c in results} == {"spark02"}
    p2p = by_tier(results, "spark02")["l1_p2p"]
    assert p2p["status"] == h.UNVERIFIED and "no other serving Spark" in p2p["reason"]
    assert canary.Canary(cluster.target, out=lambda _: None).run([]) == []
