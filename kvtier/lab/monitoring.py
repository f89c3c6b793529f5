"""The lab's monitoring, seen as an operator sees it: the health timer on ops01 feeding Prometheus there, an alert
firing for a fault and resolving after its repair (read from Prometheus's alerts API), and every panel of the
dashboard returning a series for every host it should."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request

from kvtier.lab import operator_install
from kvtier.lab.inventory import INVENTORY, REPO, SPARKS, STORAGE
from kvtier.lab.stages import StageFailed
from kvtier.lab.strategy import run_playbook
from kvtier.monitoring import dashboard, targets

PROMETHEUS = f"http://{operator_install.ADDRESS}:{targets.PROMETHEUS_PORT}"
# The lab's health timer: a short interval, as the issue of a lab asks; a stage starts a run at once where it waits.
HEALTH_INTERVAL = "2min"
HEALTH_UNIT = "kvtier-health.service"
# Which hosts each dashboard panel must answer for in the lab (the router runs on the storage node).
PANEL_HOSTS = {
    "spark": set(SPARKS),
    "storage": {STORAGE},
    "router": {STORAGE},
    "monitoring": {operator_install.HOST},
    "l3_evictor": {"spark01"},  # inventory/lab: kvtier_l3_evictor_node
    "any": set(),
}


def install_health_timer(out, repair: bool = False) -> str:
    """playbooks/health_timer.yml on ops01, with the operator's kvtier and copy of the inventory (root runs it: the
    textfile directory is node_exporter's); `repair` switches its automatic repair on."""
    extravars = {
        "health_timer_repair": repair,
        "health_timer_host": operator_install.HOST,
        "health_timer_kvtier": f"{operator_install.HOME}/kvtier/bin/kvtier",
        "health_timer_inventory": f"{operator_install.HOME}/lab/hosts.yml",
        "health_timer_interval": HEALTH_INTERVAL,
    }
    ok, _, seconds, failures = run_playbook(REPO, "health_timer.yml", INVENTORY, out=out, extravars=extravars)
    if not ok:
        raise StageFailed("health_timer.yml on ops01: " + ("; ".join(failures) or "failed"))
    return (
        f"health timer on {operator_install.HOST} every {HEALTH_INTERVAL}{', repairing' if repair else ''} "
        f"({seconds:.0f} s)"
    )


def run_health_now() -> float:
    """Start the timer's service now (it returns when the run ended): seconds it took."""
    started = time.monotonic()
    proc = subprocess.run(
        ["podman", "exec", operator_install.CONTAINER, "systemctl", "start", HEALTH_UNIT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        status = subprocess.run(
            ["podman", "exec", operator_install.CONTAINER, "journalctl", "-u", HEALTH_UNIT, "-n", "15", "--no-pager"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        raise StageFailed(f"{HEALTH_UNIT} on {operator_install.HOST} failed: {proc.stderr.strip()}\n{status}")
    return time.monotonic() - started


def _get(path: str, **params) -> dict:
    url = f"{PROMETHEUS}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
    except OSError as exc:
        raise StageFailed(f"Prometheus at {url}: {exc}") from None
    if body.get("status") != "success":
        raise StageFailed(f"Prometheus at {url}: {body.get('error', body)}")
    return body["data"]


def query(expr: str) -> list:
    """The instant vector `expr` evaluates to now: [{"metric": labels, "value": [time, "value"]}]."""
    return _get("/api/v1/query", query=expr)["result"]


def alerts(name: str) -> list:
    """The alerts called `name` Prometheus holds now, pending or firing, as label dicts with their state."""
    return [
        {**a["labels"], "state": a["state"]}
        for a in _get("/api/v1/alerts")["alerts"]
        if a["labels"].get("alertname") == name
    ]


def wait_for(name: str, match: dict, hosts: set, firing: bool, timeout: float = 240) -> float:
    """Seconds until the alert `name` with labels `match` is firing for every one of `hosts` (firing), or for none
    of them (not firing: resolved); StageFailed after `timeout`, naming what Prometheus holds."""
    started = time.monotonic()
    while True:
        held = [a for a in alerts(name) if all(a.get(k) == v for k, v in match.items())]
        on = {a["host"] for a in held if a["state"] == "firing"}
        done = hosts <= on if firing else not (hosts & {a["host"] for a in held})
        if done:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise StageFailed(
                f"{name} {match} {'not firing' if firing else 'still held'} for {sorted(hosts)} after {timeout:.0f} s: "
                + (", ".join(f"{a['host']} {a.get('check', '')} {a['state']}" for a in held) or "no such alert")
            )
        time.sleep(3)


def panels_answer(out) -> str:
    """Every panel's query of the committed dashboard, run against the lab's Prometheus: each returns a series for
    every host its panel names."""
    committed = json.loads(dashboard.OUTPUT.read_text())
    expected = {p.title: p.hosts for p in dashboard.PANELS}
    missing = []
    found = dashboard.queries(committed)
    for title, expr in found:
        series = query(dashboard.live_expr(expr))
        hosts = {s["metric"].get("host", "") for s in series}
        want = set().union(*(PANEL_HOSTS[g] for g in expected.get(title, ("any",))))
        lacking = want - hosts
        out(f"  {title[:60]:<60} {len(series):>3} series, hosts {', '.join(sorted(hosts)) or '-'}")
        if not series or lacking:
            missing.append(f"{title}: {'no series' if not series else 'none for ' + ', '.join(sorted(lacking))}")
    if missing:
        raise StageFailed("dashboard panels without data: " + "; ".join(missing))
    return f"{len(found)} panel queries, each with a series for every host it names"
