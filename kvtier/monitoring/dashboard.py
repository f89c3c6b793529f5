"""kvtier's Grafana dashboard: hits, loads and fill of each KV-cache tier, TTFT, the router and the health checks.

The panels are data (PANELS); build() turns them into dashboard JSON with Grafana's own SDK
(grafana-foundation-sdk), so the committed roles/monitoring/files/kvtier-dashboard.json is generated, never hand-edited:
`python -m kvtier.monitoring.dashboard` writes it, `--check` fails when it is stale. queries() and live_expr() need
no SDK: a live test runs every panel's query from the committed JSON against a cluster's Prometheus.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys

try:  # the generator's dependency only: queries() and live_expr() work without it
    from grafana_foundation_sdk.builders import common, prometheus, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.builders import dashboard as dash
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as common_model
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus as prometheus_model
except ImportError as exc:
    _SDK_MISSING: ImportError | None = exc
else:
    _SDK_MISSING = None

REPO = pathlib.Path(__file__).resolve().parents[2]
OUTPUT = REPO / "roles" / "monitoring" / "files" / "kvtier-dashboard.json"
UID = "kvtier"
TITLE = "kvtier: KV-cache tiers"
# The monitoring role's defaults (monitoring_l3_mount_point, monitoring_router_backend); a unit test keeps them equal.
L3_MOUNT_POINT = "/srv/kvcache"
ROUTER_BACKEND = "vllm"
# kvtier_health_status's values (kvtier/health/report.py), as the status panels show them.
HEALTH_STATES = {0: ("OK", "green"), 1: ("WARN", "yellow"), 2: ("ERR", "red"), 3: ("UNVERIFIED", "blue")}
# haproxy_server_status{state="UP"}: 1 while the Spark is in the router's rotation.
ROUTER_STATES = {1: ("UP", "green"), 0: ("out", "red")}
# What each dashboard variable stands for when a query runs outside Grafana (live_expr).
LIVE_VALUES = {"host": ".*", "datasource": "prometheus", "__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

HOST = 'host=~"$host"'
L3_FS = f'mountpoint="{L3_MOUNT_POINT}",{HOST}'


@dataclasses.dataclass(frozen=True)
class Panel:
    """One panel, one query. hosts: the inventory group a live cluster's answer must hold a series for
    ("spark", "storage", "router", "monitoring", "l3_evictor" or "any"); kind: Grafana's visualization."""

    title: str
    expr: str
    unit: str
    hosts: tuple[str, ...]
    row: str
    legend: str = "{{host}}"
    kind: str = "timeseries"


ROW_HITS = "Hits per tier (L0 local DRAM, lower tiers)"
ROW_LOWER = "Lower tiers: L1 peer-to-peer, L2 remote memory, L3 NVMe pool"
ROW_SERVING = "Serving: TTFT and the router"
ROW_HEALTH = "kvtier health checks"

PANELS = (
    Panel(
        "Hit tokens/s per tier: L0 local DRAM, lower tiers (L1, L2, L3 together)",
        f"host_tier:kvtier_hit_tokens:rate5m{{{HOST}}}",
        "short",
        ("spark",),
        ROW_HITS,
        legend="{{host}} {{tier}}",
    ),
    Panel(
        "Hit rate, all tiers",
        f"host:kvtier_hit_rate:ratio_rate5m{{{HOST}}}",
        "percentunit",
        ("spark",),
        ROW_HITS,
    ),
    Panel(
        "Hit rate per tier: L0 local DRAM, lower tiers",
        f"host_tier:kvtier_hit_rate:ratio_rate5m{{{HOST}}}",
        "percentunit",
        ("spark",),
        ROW_HITS,
        legend="{{host}} {{tier}}",
    ),
    Panel(
        "Lookups: prompt tokens/s looked up",
        f"host:kvtier_lookup_tokens:rate5m{{{HOST}}}",
        "short",
        ("spark",),
        ROW_HITS,
    ),
    Panel(
        "Loads/s per lower tier: L1 peer-to-peer, L2 remote memory, L3 NVMe pool",
        f"host_tier:kvtier_loads:rate5m{{{HOST}}}",
        "ops",
        ("spark",),
        ROW_LOWER,
        legend="{{host}} {{tier}}",
    ),
    Panel(
        "L1 peer-to-peer: P2P health checks",
        f'kvtier_health_status{{tier="l1_p2p",{HOST}}}',
        "none",
        ("spark",),
        ROW_LOWER,
        legend="{{host}} {{check}}",
        kind="state-timeline",
    ),
    Panel(
        "L2 remote memory (Valkey/Redis): fill of maxmemory",
        f"redis_memory_used_bytes{{{HOST}}} / (redis_memory_max_bytes{{{HOST}}} > 0)",
        "percentunit",
        ("storage",),
        ROW_LOWER,
    ),
    Panel(
        "L2 remote memory (Valkey/Redis): used",
        f"redis_memory_used_bytes{{{HOST}}}",
        "bytes",
        ("storage",),
        ROW_LOWER,
    ),
    Panel(
        "L3 NVMe pool: fill",
        f"1 - node_filesystem_avail_bytes{{{L3_FS}}} / node_filesystem_size_bytes{{{L3_FS}}}",
        "percentunit",
        ("storage",),
        ROW_LOWER,
    ),
    Panel(
        "L3 NVMe pool: used of the evictor's budget (high watermark at 90 %)",
        f"kvtier_l3_used_bytes{{{HOST}}} / kvtier_l3_budget_bytes{{{HOST}}}",
        "percentunit",
        ("l3_evictor",),
        ROW_LOWER,
    ),
    Panel(
        "TTFT p95",
        f"host:vllm_time_to_first_token_seconds:p95_rate5m{{{HOST}}}",
        "s",
        ("spark",),
        ROW_SERVING,
    ),
    # The router's own host label; its servers are the Sparks, so $host does not apply.
    Panel(
        "Router: Sparks in HAProxy's rotation",
        f'haproxy_server_status{{proxy="{ROUTER_BACKEND}",state="UP"}}',
        "none",
        ("router",),
        ROW_SERVING,
        legend="{{server}}",
        kind="state-timeline",
    ),
    Panel(
        "Health status per check",
        f"kvtier_health_status{{{HOST}}}",
        "none",
        ("spark", "storage"),
        ROW_HEALTH,
        kind="table",
    ),
    # Written on the host that runs the health timer: no $host filter.
    Panel(
        "Age of the last health run",
        "time() - kvtier_health_last_run_timestamp_seconds",
        "s",
        ("monitoring",),
        ROW_HEALTH,
        kind="stat",
    ),
)

_WIDTH = {"timeseries": 12, "state-timeline": 12, "table": 18, "stat": 6}
# $host, ${host} and ${host:regex}: Grafana's variable syntaxes.
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def _mappings(states: dict) -> list:
    """One value mapping: {value: (text, color)}."""
    items = enumerate(states.items())
    options = {str(v): model.ValueMappingResult(text=t, color=c, index=i) for i, (v, (t, c)) in items}
    return [model.ValueMap(options=options)]


def _panel(spec: Panel, panel_id: int, datasource):
    """The SDK's panel builder for one Panel."""
    query = prometheus.Dataquery().expr(spec.expr).legend_format(spec.legend).ref_id("A")
    legend = common.VizLegendOptions().show_legend(True).display_mode(common_model.LegendDisplayMode.LIST)
    if spec.kind == "timeseries":
        panel = timeseries.Panel().legend(legend).fill_opacity(10)
        if spec.unit == "percentunit":
            panel = panel.min(0).max(1)
    elif spec.kind == "state-timeline":
        states = HEALTH_STATES if spec.expr.startswith("kvtier_health_status") else ROUTER_STATES
        panel = statetimeline.Panel().legend(legend).merge_values(True).mappings(_mappings(states))
    elif spec.kind == "table":
        query = query.instant().format(prometheus_model.PromQueryFormat.TABLE)
        hidden = {"Time": True, "__name__": True, "instance": True, "job": True}
        panel = (
            table.Panel()
            .show_header(True)
            .mappings(_mappings(HEALTH_STATES))
            .with_transformation(
                model.DataTransformerConfig(
                    id_val="organize", options={"excludeByName": hidden, "renameByName": {"Value": "status"}}
                )
            )
        )
    elif spec.kind == "stat":
        panel = stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
    else:
        raise ValueError(f"{spec.title}: unknown panel kind {spec.kind!r}")
    return (
        panel.id(panel_id)
        .title(spec.title)
        .datasource(datasource)
        .unit(spec.unit)
        .span(_WIDTH[spec.kind])
        .height(8)
        .with_target(query)
    )


def build() -> dict:
    """The dashboard as JSON-able data: a Prometheus datasource variable, a host variable, one row per topic."""
    if _SDK_MISSING is not None:
        raise RuntimeError(f"the dashboard generator needs grafana-foundation-sdk (requirements.lock): {_SDK_MISSING}")
    datasource = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (
        dash.Dashboard(TITLE)
        .uid(UID)
        .tags(["kvtier"])
        .time("now-6h", "now")
        .refresh("1m")
        .with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            dash.QueryVariable("host")
            .label("host")
            .datasource(datasource)
            .query("label_values(kvtier_health_status, host)")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    panel_id = 0
    for row in dict.fromkeys(p.row for p in PANELS):
        panel_id += 1
        board = board.with_row(dash.Row(row).id(panel_id))
        for spec in (p for p in PANELS if p.row == row):
            panel_id += 1
            board = board.with_panel(_panel(spec, panel_id, datasource))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    """The committed file's text: sorted keys, indent 2, a trailing newline."""
    return json.dumps(build(), sort_keys=True, indent=2) + "\n"


def live_expr(expr: str) -> str:
    """`expr` as Prometheus runs it outside Grafana: each dashboard variable replaced by LIVE_VALUES' value ($host
    by `.*`, every host; the datasource by Prometheus itself; Grafana's intervals by fixed ones)."""

    def value(match: re.Match) -> str:
        name = match[1] or match[2]
        if name not in LIVE_VALUES:
            raise ValueError(f"no live value for the dashboard variable ${name} in {expr!r}")
        return LIVE_VALUES[name]

    return _VARIABLE.sub(value, expr)


def queries(dashboard_json: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every Prometheus target of a dashboard's JSON, in order, rows' nested panels included
    (a collapsed row holds its panels). The exprs are as Grafana stores them, with its variables ($host): pass each
    through live_expr() to run it against Prometheus directly."""
    found = []

    def walk(panels: list) -> None:
        for panel in panels or []:
            found.extend((panel.get("title", ""), t["expr"]) for t in panel.get("targets") or [] if "expr" in t)
            walk(panel.get("panels"))

    walk(dashboard_json.get("panels"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtier.monitoring.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when PATH differs from what build() gives")
    parser.add_argument("path", nargs="?", type=pathlib.Path, default=OUTPUT, help=f"default: {OUTPUT}")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text() if args.path.exists() else None
        if current != text:
            state = "is missing" if current is None else "differs from what build() gives"
            print(f"{args.path} {state}: run `make dashboard` and commit it", file=sys.stderr)
            return 1
        print(f"{args.path} is up to date")
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text)
    print(f"wrote {args.path} ({len(PANELS)} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
