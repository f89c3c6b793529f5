"""The tier proof: its table never hides a tier, a failed request says why, disruptive steps are refused
unless allowed, and a node is reached the way Ansible reaches it."""

import http.server
import threading

import pytest

from kvtier import exits
from kvtier.cluster import load_spec
from kvtier.nodes import transport as nodes
from kvtier.nodes.target import Target
from kvtier.proof import cli as proof_cli
from kvtier.proof import tiers
from tests.unit._cluster_data import spec_dict


class ScriptedNode(nodes.Node):
    """A node on this machine whose journal is a given text (no systemd here); everything else runs for real."""

    def __init__(self, name, journal=""):
        super().__init__(name, [])
        self.journal, self.calls = journal, []

    def run(self, *command, stdin=None, timeout=600):
        self.calls.append(command)
        if command[0] == "journalctl":
            return self.journal
        return super().run(*command, stdin=stdin, timeout=timeout)


def target(node, vllm_port=8000):
    data = spec_dict()
    data["nodes"] = {"spark01": {"data_address": "10.10.0.21", "ports": {"vllm_http": vllm_port}}}
    data["p2p"]["coordinator"]["node"] = "spark01"
    return Target(
        spec=load_spec(data), nodes={"spark01": node}, l2_admin_user="kvtier-admin", l2_admin_password="x" * 24
    )


def hit(tier, cached, delta, attempt=1, why="", source=""):
    return tiers.Hit(tier, "spark01", cached, 1636, "a counter", delta, 0.4, 0.9, source, attempt, why)


def test_the_table_flags_a_tier_whose_counter_did_not_move():
    hits = [hit("l0", 1600, 1600), hit("l2", 1600, 0), hit("l3", 0, 3)]
    lines = tiers.table(hits)
    assert [h.proven for h in hits] == [True, False, False]
    assert "NOT PROVEN" not in lines[1]
    assert all("NOT PROVEN" in line for line in lines[2:])
    assert "0.40 (0.90)" in lines[1]  # this request's time, then the cold request's


def test_a_hit_with_another_answer_or_from_a_later_tier_is_not_proven():
    wrong = tiers.Hit("l3", "spark01", 1600, 1636, "c", 3, 0.4, 0.9, wrong_answer="token 1 is 'x' where ...")
    late = tiers.Hit("l3", "spark01", 1600, 1636, "c", 3, 0.4, 0.9, also_loaded="resp (2 loads)")
    rows = tiers.table([wrong, late])
    assert not wrong.proven and not late.proven
    assert rows[3] == "  spark01 L3 NVMe pool: a wrong answer from the cache: token 1 is 'x' where ..."
    assert rows[4] == "  spark01 L3 NVMe pool: also loaded from resp (2 loads), looked up after it"


def test_a_peer_hit_names_the_spark_that_computed_it_and_a_miss_says_why():
    miss = hit("l1", 0, 0, why="spark01 sees P2P registered, peers none", source="spark02")
    rows = tiers.table([miss])
    assert "L1 peer (P2P) from spark02" in rows[1] and rows[1].endswith("<- NOT PROVEN")
    assert rows[2] == "  spark01 L1 peer (P2P) from spark02: spark01 sees P2P registered, peers none"
    assert miss.to_dict()["proven"] is False and miss.to_dict()["label"] == "L1 peer (P2P) from spark02"


class _DeadEngine(http.server.BaseHTTPRequestHandler):
    """What vLLM's API server answers once its engine has died."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.send_response(500, "Internal Server Error")
        self.end_headers()
        self.wfile.write(b'{"error": "EngineCore encountered an issue"}')

    def log_message(self, *args):
        pass


def test_a_failed_request_says_why_from_the_vllm_journal():
    server = http.server.HTTPServer(("127.0.0.1", 0), _DeadEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    journal = (
        "INFO 12-03 07:48:22 [core.py:1] serving\n"
        "ERROR 12-03 07:48:28 [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: -4)\n"
        "ERROR 12-03 07:48:28 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
        "encountered an issue.\n"
    )
    proof = tiers.Proof(target(ScriptedNode("spark01", journal), server.server_port))
    try:
        with pytest.raises(tiers.EngineFailed) as failure:
            proof.complete("spark01", "a prompt")  # the request is sent by the probe code, on the "node"
    finally:
        server.shutdown()
    message = str(failure.value)
    assert message.startswith("spark01: vLLM answered 500: ")
    assert "VllmWorker-0 died unexpectedly (exit code: -4)" in message and "EngineDeadError" in message
    assert "serving" not in message


def test_a_request_nobody_answers_is_a_proof_error_not_an_engine_death():
    proof = tiers.Proof(target(ScriptedNode("spark01"), vllm_port=1))
    with pytest.raises(tiers.ProofError) as failure:
        proof.complete("spark01", "a prompt")
    assert not isinstance(failure.value, tiers.EngineFailed)
    assert "vLLM answered nothing" in str(failure.value)


def test_a_step_whose_engine_died_is_reported_and_run_once_more(monkeypatch):
    proof, ready, attempts, lines = tiers.Proof(target(ScriptedNode("spark01")), out=None), [], [], []
    proof.out = lines.append
    monkeypatch.setattr(proof, "wait_ready", ready.append)

    def step(attempt):
        attempts.append(attempt)
        if attempt == 1:
            raise tiers.EngineFailed("spark02", "spark02: vLLM answered 500: Worker died (exit code: -4)")
        return ["hit"]

    assert proof.once_more(step) == ["hit"]
    assert attempts == [1, 2] and ready == ["spark02"]
    assert lines[0] == "  ! spark02: vLLM answered 500: Worker died (exit code: -4)"
    assert "runs once more" in lines[1]


def test_an_engine_that_dies_twice_fails_the_proof(monkeypatch):
    proof = tiers.Proof(target(ScriptedNode("spark01")), out=lambda line: None)
    monkeypatch.setattr(proof, "wait_ready", lambda host: None)

    def step(attempt):
        raise tiers.EngineFailed("spark01", f"spark01: died on attempt {attempt}")

    with pytest.raises(tiers.EngineFailed, match="died on attempt 2"):
        proof.once_more(step)


def test_a_tier_that_is_not_proven_is_not_retried():
    calls = []
    proof = tiers.Proof(target(ScriptedNode("spark01")), out=lambda line: None)

    def step(attempt):
        calls.append(attempt)
        return [hit("l1", 0, 0)]

    assert not proof.once_more(step)[0].proven
    assert calls == [1]


def test_lmcache_warnings_are_read_from_the_journal_without_colours_or_source_locations():
    journal = (
        "\x1b[32;20m[2026-12-03 10:17:07,304] LMCache INFO:\x1b[0m P2P lookup submitted: task_id=0 "
        "\x1b[3m(p2p_controller.py:309:lmcache.v1.multiprocess.modules.p2p_controller)\x1b[0m\n"
        "\x1b[33;20m[2026-12-03 10:22:26,995] LMCache WARNING:\x1b[0m P2P lookup submit to tcp://10.213.7.22:5555 "
        "timed out; treating as a miss "
        "\x1b[3m(p2p_l2_adapter.py:234:lmcache.v1.distributed.l2_adapters.p2p_l2_adapter)\x1b[0m\n"
        "[2026-12-03 10:22:27,001] LMCache ERROR: transfer failed (nixl_impl.py:150:lmcache.v1.distributed)\n"
    )
    node = ScriptedNode("spark01", journal)
    proof = tiers.Proof(target(node))
    assert proof.lmcache_warnings("spark01", since=1764757000.4) == [
        "WARNING: P2P lookup submit to tcp://10.213.7.22:5555 timed out; treating as a miss",
        "ERROR: transfer failed",
    ]
    assert node.calls == [
        ("journalctl", "--unit", "kvtier-lmcache.service", "--since", "@1764757000", "--output", "cat", "--no-pager")
    ]
    assert proof.lmcache_warnings("spark01", since=0, keep=1) == ["ERROR: transfer failed"]


def test_counters_are_read_by_the_probe_code_on_the_node(tmp_path):
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = (
                "lmcache_mp_lookup_hit_l1_tokens_total 1504.0\n"
                'lmcache_mp_l2_load_completed_requests_total{l2_name="resp"} 2.0\n'
            ).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    t = target(ScriptedNode("spark01"))
    t.spec = load_spec(
        {
            **spec_dict(),
            "nodes": {"spark01": {"data_address": "10.10.0.21", "ports": {"lmcache_http": server.server_port}}},
            "p2p": {"coordinator": {"node": "spark01", "port": 9300}},
        }
    )
    try:
        summary = tiers.Proof(t).counters("spark01")
    finally:
        server.shutdown()
    assert summary["l1_hit_tokens"] == 1504 and summary["l2"]["resp"]["loads"] == 2


def test_only_the_l0_proof_runs_without_leave_to_disturb():
    assert tiers.refused(["l0"], allow_disruptive=False) == []
    lines = tiers.refused(["l0", "l2", "l3", "l1"], allow_disruptive=False)
    assert len(lines) == 3 and all("--disruptive" in line for line in lines)
    assert "FLUSHALL" in lines[1] and "restarts" in lines[1]
    assert tiers.refused(list(tiers.TIERS), allow_disruptive=True) == []


def test_kvtier_prove_refuses_a_disruptive_tier_before_reading_anything(capsys):
    # The inventory does not exist: a refusal that came after reading it would say so instead.
    parser = __import__("kvtier.cli", fromlist=["build_parser"]).build_parser()
    args = parser.parse_args(["prove", "-i", "/nonexistent", "--tier", "l3"])
    assert proof_cli._cmd_prove(args) == exits.REFUSED
    err = capsys.readouterr().err
    assert "refused: proving L3 NVMe pool" in err and "/nonexistent" not in err


def test_kvtier_prove_without_leave_to_disturb_proves_l0_only(monkeypatch, capsys):
    asked = []

    class Recorder:
        def __init__(self, target, out):
            pass

        def run(self, wanted, hosts):
            asked.append(list(wanted))
            return [hit("l0", 1632, 1632)]

    monkeypatch.setattr(proof_cli.tiers, "Proof", Recorder)
    monkeypatch.setattr("kvtier.nodes.target.from_inventory", lambda inventory: None)
    monkeypatch.setattr("kvtier.inventory.Inventory", lambda path, vault=None: None)
    parser = __import__("kvtier.cli", fromlist=["build_parser"]).build_parser()
    assert proof_cli._cmd_prove(parser.parse_args(["prove", "-i", "inv"])) == 0
    assert proof_cli._cmd_prove(parser.parse_args(["prove", "-i", "inv", "--disruptive"])) == 0
    assert asked == [["l0"], list(tiers.TIERS)]
    assert "L0 local DRAM" in capsys.readouterr().out


def test_nodes_are_reached_as_ansible_reaches_them():
    lab = nodes.from_hostvars(
        "spark01", {"ansible_connection": "containers.podman.podman", "ansible_host": "kvtier-lab-spark01"}
    )
    assert lab.argv("journalctl", "-u", "x") == ["podman", "exec", "-i", "kvtier-lab-spark01", "journalctl", "-u", "x"]
    real = nodes.from_hostvars(
        "spark02",
        {
            "ansible_host": "192.168.1.22",
            "ansible_user": "ops",
            "ansible_port": 2222,
            "ansible_become": True,
            "ansible_ssh_common_args": "-o ProxyJump=bastion",
        },
    )
    argv = real.argv("find", "/mnt/kvcache dir", "-newer", "x")
    assert argv[:6] == ["ssh", "-o", "BatchMode=yes", "-o", "ProxyJump=bastion", "-p"]
    assert argv[-2] == "ops@192.168.1.22"
    # ssh hands the command to a shell: each word is quoted, and become runs it through sudo.
    assert argv[-1] == "sudo -n find '/mnt/kvcache dir' -newer x"
    with pytest.raises(nodes.NodeError, match="winrm"):
        nodes.from_hostvars("spark03", {"ansible_connection": "winrm"})


def test_a_failing_command_names_the_node_and_the_command():
    with pytest.raises(nodes.NodeError, match=r"^spark01: false: exit 1$"):
        nodes.local("spark01").run("false")
    assert nodes.local("spark01").python("", "sum([1, 2])") == 3
