"""Day-2 stages of the lab: maintenance under a steady stream of client requests through the router.

  spec change       site.yml's second run with a change to kvtier_cluster, applied one Spark at a time;
  L2 repair         playbooks/repair_lmcache.yml (the rolling restart in repair mode) after the storage node's reboot.
Meanwhile a client sends requests through the router and a watcher reads the router's statistics page: every
request must succeed, and each Spark's time out of rotation is measured from the router's own view.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import secrets
import time

import yaml

from kvtier.bench.stream import Background, ClientStream, summarize
from kvtier.lab import credentials
from kvtier.lab.stages import StageFailed
from kvtier.lab.strategy import run_playbook
from kvtier.probes import router as router_probe

REPO = pathlib.Path(__file__).resolve().parents[2]
ROUTER_DEFAULTS = REPO / "roles" / "router" / "defaults" / "main.yml"
# The client's prompts: a few, cycled, each several chunks long (after the first cycle they are cache hits).
CLIENT_PROMPTS = 4
CLIENT_WORDS = 300
# A steady trickle, not a load test: on a 2-core machine a faster stream slows every vLLM start it waits for.
CLIENT_INTERVAL = 2.0


class RouterWatch(Background):
    """Polls the router's statistics page: every status each server had, with when it started."""

    def __init__(self, stats_url: str, backend: str, interval: float = 0.5, login: tuple | None = None, context=None):
        super().__init__(interval, join_timeout=10)
        self.stats_url, self.backend = stats_url, backend
        # One kept-alive connection: on the lab's one-vCPU TCG storage VM, a TLS handshake twice a second is work
        # enough for the router to be caught in it whenever the busy host does not run the VM.
        self._reader = router_probe.StatsReader(stats_url, backend, login=login, context=context)
        self.history: dict = {}  # server -> [(epoch seconds, status)]
        self.current: dict = {}  # server -> status, as last read: a server taken out of the backend is not in it
        self.errors = 0

    def step(self) -> None:
        try:
            now, states = time.time(), self._reader.read()
        except (OSError, router_probe.RouterError):
            self.errors += 1
            return
        self.current = states
        for server, status in states.items():
            seen = self.history.setdefault(server, [])
            if not seen or seen[-1][1] != status:
                seen.append((now, status))

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._reader.close()

    def out_of_rotation(self) -> dict:
        """{server: seconds not UP} over the watch (drained, in maintenance or failing its checks)."""
        return out_of_rotation(self.history, time.time())

    def last(self) -> dict:
        return {server: seen[-1][1] for server, seen in self.history.items() if seen}


def out_of_rotation(history: dict, until: float) -> dict:
    result = {}
    for server, seen in history.items():
        total = 0.0
        for (at, status), (next_at, _) in zip(seen, seen[1:] + [(until, None)], strict=True):
            if status != "UP":
                total += next_at - at
        result[server] = round(total, 1)
    return result


@dataclasses.dataclass(frozen=True)
class RouterClient:
    """The lab's router as a client and the operator reach it: HTTPS, a tenant's key, the statistics page's login."""

    url: str
    stats_url: str
    backend: str
    tenant_keys: dict  # tenant name -> key
    stats_login: tuple

    @property
    def key(self) -> str:
        """The first tenant's key: the lab's client stream is that tenant."""
        return self.tenant_keys[credentials.TENANTS[0]]


def router_client(address: str) -> RouterClient:
    """The router at `address` (ports and names from the router role's defaults, secrets from the lab's own), with
    this process trusting its certificate."""
    defaults = yaml.safe_load(ROUTER_DEFAULTS.read_text())
    values = credentials.passwords(credentials.STATE)
    credentials.trust_router()
    base = f"https://{address}"
    return RouterClient(
        f"{base}:{defaults['router_port']}",
        f"{base}:{defaults['router_stats_port']}/stats",
        defaults["router_backend_name"],
        {name: values[f"tenant_key_{name}"] for name in credentials.TENANTS},
        (defaults["router_stats_user"], values["router_stats_password"]),
    )


def client_prompts(nonce: str) -> list:
    words = " ".join(f"w{n % 97}" for n in range(CLIENT_WORDS))
    return [f"kvtier lab client {nonce} prompt {i}: {words}" for i in range(CLIENT_PROMPTS)]


@contextlib.contextmanager
def under_client_stream(out, address: str, model: str):
    """A warmed client stream through the router and a watch of its statistics, for the `with` body's duration.
    Yields (stream, watch); the caller reads their results after the body."""
    router = router_client(address)
    url = router.url
    stream = ClientStream(
        url, model, client_prompts(secrets.token_hex(4)), interval=CLIENT_INTERVAL, api_key=router.key
    )
    warm = stream.warm()
    if not all(r["ok"] for r in warm):
        raise StageFailed(f"the router at {url} did not answer the client: {[r['error'] for r in warm if not r['ok']]}")
    out(f"  client stream through the router {url} (prompts warmed in {sum(r['seconds'] for r in warm):.1f} s)")
    watch = RouterWatch(
        router.stats_url, router.backend, login=router.stats_login, context=credentials.router_context()
    )
    with watch, stream:
        yield stream, watch


def report(out, stream: ClientStream, watch: RouterWatch, leaving=None, stopping=None) -> str:
    """Print and check what the client and the router saw: no failed request, each Spark of `leaving` (default:
    every Spark) out of rotation for a while (the drain happened), and every Spark UP at the end.

    `stopping`, the (start, end) epoch seconds of a Spark stopped without a drain: vLLM aborts the requests it holds
    when it is told to stop (and rejects new ones until it has), so a request under way then may fail without any
    fault of the router's. Such requests are reported as cut, not counted as failed; every other must succeed."""
    cut, kept = [], []
    for r in stream.results:
        (cut if not r["ok"] and stopping and _overlaps(r, stopping) else kept).append(r)
    s = summarize(kept)
    away = watch.out_of_rotation()
    out(
        f"  client: {s['requests']} requests, {s['failed']} failed; TTFT p50 {s['ttft_p50']} s, p95 {s['ttft_p95']} s, "
        f"worst {s['ttft_max']} s; slowest request {s['seconds_max']} s"
    )
    for r in cut:
        out(f"  client: a request under way while the Spark stopped was cut: {r['status'] or 'no answer'} {r['error']}")
    for server, seen in sorted(watch.history.items()):
        path = " -> ".join(status for _, status in seen)
        out(f"  router: {server} {path}; out of rotation {away.get(server, 0.0):.0f} s")
    problems = [f"{s['failed']} of {s['requests']} requests failed ({'; '.join(s['errors'])})"] if s["failed"] else []
    problems += [f"{srv} is {st} at the router" for srv, st in watch.last().items() if st != "UP"]
    problems += [f"{srv} never left rotation" for srv, secs in away.items() if not secs and srv in (leaving or away)]
    if not watch.history:
        problems.append("the router's statistics page never answered")
    if problems:
        raise StageFailed("; ".join(problems))
    return (
        f"0 of {s['requests']} client requests failed"
        + (f" ({len(cut)} cut by the stop)" if cut else "")
        + f" (TTFT p50 {s['ttft_p50']} s, worst {s['ttft_max']} s); "
        + ", ".join(f"{srv} out {secs:.0f} s" for srv, secs in sorted(away.items()))
    )


def _overlaps(result: dict, window: tuple) -> bool:
    """Whether a streamed request (`at` is when it ended) was under way at some time within `window`."""
    began, ended = window
    return result["at"] - result["seconds"] <= ended and result["at"] >= began


def playbook_under_stream(out, inventory, address: str, model: str, playbook: str, extravars=None, changes=None):
    """Run `playbook` while a client streams requests through the router; (its run time, the stage's note).
    `changes`, when given, receives "host: task" for every task that changed something."""
    with under_client_stream(out, address, model) as (stream, watch):
        ok, _, seconds, failures = run_playbook(
            REPO, playbook, inventory, out=out, extravars=extravars, changes=changes
        )
    if not ok:
        raise StageFailed("; ".join(failures) or f"{playbook} failed")
    return seconds, report(out, stream, watch)
