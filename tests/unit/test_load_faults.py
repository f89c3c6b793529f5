"""The lab's failing-load fault edits exactly what it says in a Spark's units (kvtier/lab/load_faults.py)."""

import json

import pytest

from kvtier.cluster.systemd import exec_line
from kvtier.lab import load_faults
from kvtier.lab.stages import StageFailed


class FileNode:
    """A node whose files are a dict: `cat`, `tee`, `stat`, `install` and `systemctl` as the fault runs them."""

    def __init__(self, files):
        self.files, self.calls = dict(files), []

    def run(self, *command, stdin=None, timeout=600):
        self.calls.append(command)
        if command[0] == "cat":
            return self.files[command[1]]
        if command[0] == "tee":
            self.files[command[1]] = stdin
            return stdin
        if command[0] == "stat":
            return "990:990\n"
        return ""


class Target:
    units = {"lmcache": "kvtier-lmcache.service", "vllm": "kvtier-vllm.service"}

    def __init__(self, node):
        self.nodes = {"spark02": node}


def _units(policy="recompute"):
    lmcache = exec_line(
        ["/venv/bin/lmcache", "server", "--l2-adapter", '{"type":"fs"}', "--l2-adapter", '{"type":"resp"}']
    )
    config = json.dumps({"kv_connector": "LMCacheMPConnector", "kv_load_failure_policy": policy}, separators=(",", ":"))
    vllm = exec_line(["/venv/bin/python", "-m", "vllm", "--kv-transfer-config", config])
    return {
        "/etc/systemd/system/kvtier-lmcache.service": f"[Service]\nExecStart={lmcache}\n",
        "/etc/systemd/system/kvtier-vllm.service": f"[Service]\nExecStart={vllm}\n",
    }


def test_the_fault_inject_adapter_goes_first_and_vllm_fails_a_failed_load():
    node = FileNode(_units())
    said = load_faults.inject(Target(node), "spark02")
    assert said == "fault_inject first, failing 10% of its loads, vLLM's kv_load_failure_policy fail"
    lmcache = node.files["/etc/systemd/system/kvtier-lmcache.service"]
    first = lmcache.index("--l2-adapter ") + len("--l2-adapter ")
    assert lmcache[first:].startswith('"{\\"inner\\":{\\"base_path\\":\\"/var/lib/kvtier/fault-inject\\"')
    assert lmcache.count("--l2-adapter ") == 3
    assert '\\"kv_load_failure_policy\\":\\"fail\\"' in node.files["/etc/systemd/system/kvtier-vllm.service"]
    assert ("install", "-d", "-m", "0700", "-o", "990", "-g", "990", load_faults.DIRECTORY) in node.calls
    assert node.calls[-1] == ("systemctl", "daemon-reload")


def test_a_unit_without_the_recompute_policy_is_refused():
    node = FileNode(_units(policy="fail"))
    with pytest.raises(StageFailed, match="kvtier-vllm.service does not hold"):
        load_faults.inject(Target(node), "spark02")
