"""Stages that check a serving lab: site.yml, the tier proof, health and canaries, the attacker, idle CPU, the bench,
the spec change under a client stream, the persistence check."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import urllib.parse

import yaml

from kvtier.bench import cli as bench
from kvtier.bench import ttft as bench_ttft
from kvtier.cluster import derive
from kvtier.health import checks as health_checks
from kvtier.health import report as health_report
from kvtier.lab import attacker, authn, day2, operator_install, pickle_proof, secret_search
from kvtier.lab.hosts import record_provisioned
from kvtier.lab.inventory import (
    CONTAINER_SPARK,
    FAULTY_SPARK,
    INVENTORY,
    INVENTORY_DIR,
    MODEL_VARS,
    REPO,
    SPARKS,
    SPEC_CHANGE_VARS,
    STATE,
    STORAGE,
    STORAGE_DATA_ADDRESS,
    proof_target,
)
from kvtier.lab.stages import StageFailed
from kvtier.lab.strategy import run_playbook, strategy_env
from kvtier.nodes.scripts import script
from kvtier.probes import cpu as cpu_probe
from kvtier.probes import health as health_probe
from kvtier.proof import canary, tiers
from kvtier.vm import host, image

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


def site(out, check: bool = False) -> str:
    """site.yml on the lab (its second run, the idempotence check, is the spec-change stage)."""
    mode = " --check --diff" if check else ""
    ok, changed, seconds, failures = run_playbook(REPO, "site.yml", INVENTORY, out=out, check=check)
    note = f"{changed} task(s) {'would change' if check else 'changed'}"
    out(f"\n  site.yml{mode}: {'ok' if ok else 'FAILED'} in {seconds:.0f} s, {note}")
    if not ok:
        raise StageFailed("; ".join(failures) or "site.yml failed")
    if not check:
        record_provisioned()
    return note


def prove(out) -> str:
    hits = tiers.Proof(proof_target(), out=out).run()
    out("")
    for line in tiers.table(hits):
        out(line)
    missed = [f"{h.host} {h.label}" for h in hits if not h.proven]
    if missed:
        raise StageFailed("not proven: " + ", ".join(missed))
    return f"{len(hits)} tier hits proven from LMCache's counters"


def idle(out, seconds: float = IDLE_SECONDS) -> str:
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


def lookup_timeouts(out, since: float) -> str:
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


def playbook(out, path: str, name: str | None = None, extravars: dict | None = None) -> str:
    """A playbook (`path` relative to playbooks/) on the lab; a failure fails the stage with the failed tasks."""
    name = name or path
    ok, _, seconds, failures = run_playbook(REPO, path, INVENTORY, out=out, extravars=extravars)
    if not ok:
        raise StageFailed("; ".join(failures) or f"{name} failed")
    return f"{name} in {seconds:.0f} s"


def _lab_playbook(out, name: str) -> str:
    """One of the lab's own test playbooks (tests/lab/)."""
    return playbook(out, f"../tests/lab/{name}", name)


def health_run(out) -> tuple:
    """(checks, seconds) of `kvtier health` on the lab, its table printed."""
    started = time.monotonic()
    found, _ = health_checks.run(proof_target())
    seconds = time.monotonic() - started
    for line in health_report.table(found).splitlines():
        out("  " + line)
    return found, seconds


def errors_in(found: list) -> list:
    """Every check that is ERR, as "host CODE"."""
    return [f"{c['host']} {c['code']}" for c in found if c["status"] == health_probe.ERR]


def healthy(out) -> str:
    """The healthy lab: no check is ERR. A WARN is shown, not failed: the lab's L3 volume lives on this machine's
    own disk, whose free space is the machine's business, not the lab's."""
    found, seconds = health_run(out)
    errors = errors_in(found)
    if errors:
        raise StageFailed("problems on a healthy lab: " + ", ".join(errors))
    counts = {s: sum(1 for c in found if c["status"] == s) for s in health_probe.STATUSES}
    warned = [f"{c['host']} {c['code']}" for c in found if c["status"] == health_probe.WARN]
    note = f"{len(found)} checks in {seconds:.1f} s: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return note + (f" ({', '.join(warned)})" if warned else "")


def canaries_clean(out) -> str:
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
    after, _ = health_run(out)
    errors = errors_in(after)
    if errors:
        raise StageFailed("health after the canaries: " + ", ".join(errors))
    return f"{len(found)} canaries OK in {seconds:.1f} s, none left in L2 or L3, health clean after them"


def attacks(out) -> str:
    """Behind every node's firewall: a host on the data network outside the inventory, and a local user on a Spark,
    are refused at each of kvtier's ports, which admit the sources that need them (kvtier.lab.attacker); what the
    firewall admits still needs its key, and one tenant gets no hit on another's prompt (kvtier.lab.authn). Why
    LMCache's port is among them: a pickle payload sent to it runs where it is reachable (kvtier.lab.pickle_proof)."""
    router = day2.router_client(STORAGE_DATA_ADDRESS)
    stats_port = urllib.parse.urlsplit(router.stats_url).port
    service_user = derive.role_defaults("vllm_lmcache")["vllm_lmcache_user"]
    t = proof_target()
    ports = attacker.run(out, t, host.VM(STORAGE), STORAGE_DATA_ADDRESS, stats_port, image.LOGIN_USER, service_user)
    spark = t.spec.nodes[-1]
    keys = authn.run(out, router, f"http://{spark.data_address}:{spark.ports.vllm_http}", t.model)
    # The venv route's Spark: LMCache runs there as a process of the node's own (the container route's runs in a
    # container).
    ran = pickle_proof.run(out, t, next(n for n in t.nodes if n != CONTAINER_SPARK), service_user)
    return f"{ports}; {keys}; {ran}"


def no_secret_in_logs(out) -> str:
    """After every run of the chain (site.yml twice, the repairs, the rolling restarts, the canaries, each probe): no
    node's journal carries a secret value (kvtier.lab.secret_search)."""
    t = proof_target()
    ops = {operator_install.HOST: lambda: operator_install.as_root(" ".join(secret_search.JOURNAL))}
    return secret_search.run(out, t, host.VM(STORAGE), t.spec.l2.user, others=ops)


def storage_reboot(out) -> str:
    """tests/lab/storage_reboot.yml: the storage node reboots (array, link, export and L2 back; a client mounts the
    export). It empties L2 under the Sparks: the L2-fault stage follows."""
    return _lab_playbook(out, "storage_reboot.yml")


def persistence(out, step: str) -> str:
    """playbooks/persistence_check.yml's store or replay step (the restarts between them are the lab's own)."""
    return playbook(out, "persistence_check.yml", extravars={"persistence_check_step": step})


def spec_change(out, marks: dict) -> str:
    """site.yml's second run, with one change to kvtier_cluster (LMCache's DRAM size: every Spark's LMCache must
    restart) while a client streams requests through the router. It applies the change one Spark at a time (no
    request fails, each Spark leaves rotation and comes back) and changes nothing else: it is also the idempotence
    check (a task outside SPEC_CHANGE_TASKS, or any change on the storage node, fails the stage)."""
    lab_vars = yaml.safe_load((INVENTORY_DIR / "group_vars" / "all" / "lab.yml").read_text())
    # On a kept lab the change builds on the last one (`kvtier lab test --stage spec-change` again).
    latest = next((p for p in (SPEC_CHANGE_VARS, MODEL_VARS) if p.exists()), None)
    cluster = (yaml.safe_load(latest.read_text()) if latest else lab_vars)["kvtier_cluster"]
    lmcache = dict(cluster["lmcache"])
    lmcache["l0_dram_gib"] = lmcache["l0_dram_gib"] + 0.0625
    SPEC_CHANGE_VARS.write_text(
        "# Generated by the lab's spec-change stage; `kvtier lab down` removes it. Do not commit.\n"
        + yaml.safe_dump({"kvtier_cluster": {**cluster, "lmcache": lmcache}}, sort_keys=False)
    )
    changes: list = []
    marks["began"] = time.time()
    seconds, streamed = under_stream(out, "site.yml", proof_target().model, changes=changes)
    record_provisioned()
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


def under_stream(out, playbook: str, model: str, changes: list | None = None) -> tuple:
    """(run time, note) of `playbook` on the lab while a client streams requests through the router, which must
    stay one process throughout (`router_kept`)."""
    with router_kept(out):
        return day2.playbook_under_stream(out, INVENTORY, STORAGE_DATA_ADDRESS, model, playbook, changes=changes)


@contextlib.contextmanager
def router_kept(out):
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


def warmup_and_bench(out) -> str:
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
    slow = [
        f"{r['host']} (write {r['write_mib_s']} MiB/s in {r['write_s']} s, read {r['read_mib_s']} MiB/s in "
        f"{r['read_s']} s, errors {r['errors']})"
        for r in rows
        if not (r["write_mib_s"] > 0 and r["read_mib_s"] > 0) or r["errors"]
    ]
    if missing or unproven or slow or len(rows) != len(SPARKS) + 1:
        raise StageFailed(
            f"missing files {missing}; hits not shown {unproven}; storage rows {len(rows)}, without figures {slow}"
        )
    tiers_seen = sorted({p["tier"] for p in points if p["sweep"] == "tiers"})
    return (
        f"warmup changed {first} then {second} task(s); TTFT bench {len(points)} requests ({', '.join(tiers_seen)}), "
        f"storage bench {len(rows)} hosts; {len(written)} files in {BENCH_DIR.relative_to(REPO)}"
    )
