"""The lab's attacker stage: what it tries, from where, and what counts as refused (kvtier/lab/attacker.py)."""

import json
import socket
import subprocess
import sys

import pytest

from kvtier.cluster import load_spec
from kvtier.lab import attacker, pickle_proof
from kvtier.lab.stages import StageFailed
from kvtier.nodes import transport as attacker_nodes
from kvtier.nodes.target import Target
from tests.unit._cluster_data import spec_dict


class _Listening:
    """A Spark as `ss -Hltn` shows it: LMCache's ports, and UCX's listener at `ucx`."""

    def __init__(self, ucx: int):
        self.ucx = ucx

    def run(self, *argv):
        assert argv == ("ss", "-Hltn")
        ports = (5555, 8080, 8500, self.ucx)
        return "".join(f"LISTEN 0 128 10.10.0.21:{p} 0.0.0.0:*\n" for p in ports) + "LISTEN 0 4096 [::1]:631 [::]:*\n"


def test_every_port_is_tried_with_a_source_that_may_reach_it():
    t = Target(spec=load_spec(spec_dict()), nodes={"spark01": _Listening(20117)})
    rows = attacker.rows(t, "10.10.0.10", 8404, "kvtier")
    tried = {(r.address, r.port): (r.allowed, r.local_user) for r in rows}
    assert tried[("10.10.0.21", 5555)] in {("spark02", ""), ("spark01", "kvtier")}
    assert tried[("10.10.0.21", 9300)] == ("spark02", "")
    assert tried[("10.10.0.22", 8000)] == ("storage", "")
    assert tried[("10.10.0.10", 6379)] in {("spark01", ""), ("spark01", "kvtier")}
    assert tried[("10.10.0.10", 2049)] == ("spark01", "")
    assert tried[("10.10.0.10", 8404)] == ("host", "")
    assert tried[("10.10.0.21", 20117)] == ("spark02", "")  # UCX's listener, found in its range
    assert sum(1 for r in rows if r.local_user) == 2


def test_a_ucx_listener_outside_its_range_fails_the_stage():
    t = Target(spec=load_spec(spec_dict()), nodes={"spark01": _Listening(41234)})
    with pytest.raises(StageFailed, match="nothing listens in UCX's range 20100-20199"):
        attacker.ucx_port(t, t.spec.nodes[0])


def test_the_probe_tells_refused_from_open():
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    targets = [("127.0.0.1", listening.getsockname()[1]), ("127.0.0.1", closed_port)]
    proc = subprocess.run([sys.executable, "-c", attacker.PROBE, json.dumps(targets)], capture_output=True, text=True)
    listening.close()
    assert json.loads(proc.stdout) == ["open", "refused"]


class _Spark:
    """A Spark that answers the pickle proof's commands: the payload's marker holds `ran_as` (None: no marker)."""

    def __init__(self, ran_as):
        self.ran_as, self.commands = ran_as, []

    def run(self, *argv, timeout=None):
        self.commands.append(argv)
        if argv[0].endswith("/bin/python"):
            assert argv[1] == "-c" and "pickle.dumps(Payload())" in argv[2]
            return json.dumps({"commit_store": "True"})
        if argv[0] == "cat":
            if self.ran_as is None:
                raise attacker_nodes.NodeError("cat: no such file")
            return self.ran_as + "\n"
        return ""


def test_the_pickle_payload_must_run_as_the_service_user():
    spark = _Spark("kvtier-svc")
    t = Target(spec=load_spec(spec_dict()), nodes={"spark01": spark})
    lines = []
    assert "ran as kvtier-svc" in pickle_proof.run(lines.append, t, "spark01", "kvtier-svc")
    python, url, marker = spark.commands[0][0], spark.commands[0][3], spark.commands[0][4]
    assert python == f"{t.spec.install.venv}/bin/python" and url == "tcp://10.10.0.21:5555"
    assert spark.commands[-1] == ("rm", "-f", marker)  # nothing left on the node
    for ran_as in (None, "root"):
        spark = _Spark(ran_as)
        with pytest.raises(StageFailed, match="did not run as kvtier-svc"):
            pickle_proof.run(lines.append, Target(spec=t.spec, nodes={"spark01": spark}), "spark01", "kvtier-svc")
        assert spark.commands[-1][:2] == ("rm", "-f")
