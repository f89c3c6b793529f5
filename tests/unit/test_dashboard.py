"""The Grafana dashboard (kvtier/monitoring/dashboard.py): the committed JSON is the generator's, and every panel
queries a real metric kvtier records, writes or scrapes, in valid PromQL."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from kvtier.health import report
from kvtier.monitoring import dashboard
from kvtier.probes import health as h

REPO = dashboard.REPO
ROLE = REPO / "roles" / "monitoring"
# The exporters' metrics the dashboard reads (redis_exporter, node_exporter, HAProxy's own exporter).
EXPORTER_METRICS = {
    "redis_memory_used_bytes",
    "redis_memory_max_bytes",
    "node_filesystem_avail_bytes",
    "node_filesystem_size_bytes",
    "haproxy_server_status",
}
# PromQL's aggregations, keywords and functions that can stand before a space, `(`-less.
PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "time", "vector", "scalar", "rate", "irate", "increase", "histogram_quantile", "label_replace", "absent",
    "inf", "nan",
}  # fmt: skip
METRIC = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?=[{\[ )]|$)")


def _committed() -> dict:
    return json.loads(dashboard.OUTPUT.read_text())


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression, crudely: string literals, label matchers, ranges and label lists of
    by/on/ignoring/... removed, then every name before `{`, `[`, a space, `)` or the end that is no PromQL word."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1 ", expr)
    return {name for name in METRIC.findall(expr) if name.lower() not in PROMQL_WORDS}


def recorded_names() -> set[str]:
    """The `record:` names of the monitoring role's rules."""
    return set(re.findall(r"^\s*-\s*record:\s*(\S+)", (ROLE / "templates" / "kvtier.rules.yml.j2").read_text(), re.M))


def health_textfile_names() -> set[str]:
    """The metric families the health textfile holds, from what report.prometheus() writes."""
    sample = h.check("spark-1", "l1_p2p", h.OK, "P2P_OK", "registered", name="p2p")
    return set(re.findall(r"^# TYPE (\S+) ", report.prometheus([sample], {}, now=0), re.M))


def evictor_textfile_names() -> set:
    """The metric families the L3 evictor's textfile holds, from what its textfile() writes."""
    path = REPO / "roles" / "l3_evictor" / "files" / "kvtier_l3_evictor.py"
    spec = importlib.util.spec_from_file_location("kvtier_l3_evictor", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return set(re.findall(r"^# TYPE (\S+) ", module.textfile(module.Run(), 100, 0.9, 0.75, 0.0), re.M))


def test_the_committed_json_is_the_generators():
    assert dashboard.OUTPUT.exists(), "no dashboard JSON: run `make dashboard`"
    assert dashboard.OUTPUT.read_text() == dashboard.render(), (
        f"{dashboard.OUTPUT.relative_to(REPO)} differs from build(): regenerate it with `make dashboard`"
    )


def test_check_mode_fails_on_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "kvtier-dashboard.json"
    stale.write_text("{}\n")
    assert dashboard.main(["--check", str(stale)]) == 1
    assert "make dashboard" in capsys.readouterr().err
    assert dashboard.main([str(stale)]) == 0
    assert dashboard.main(["--check", str(stale)]) == 0


def test_the_dashboard_is_kvtiers():
    board = _committed()
    assert (board["uid"], board["title"]) == ("kvtier", "kvtier: KV-cache tiers")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["host"]["query"] == "label_values(kvtier_health_status, host)"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == list(dict.fromkeys(p.row for p in dashboard.PANELS))


def test_every_panel_queries_a_metric_kvtier_produces():
    known = recorded_names() | health_textfile_names() | evictor_textfile_names() | EXPORTER_METRICS
    assert "host_tier:kvtier_loads:rate5m" in known and "kvtier_health_last_run_timestamp_seconds" in known
    for panel in dashboard.PANELS:
        assert panel.expr.strip(), panel.title
        names = metric_names(panel.expr)
        assert names, f"{panel.title}: {panel.expr!r} reads no metric (a constant)"
        assert names <= known, f"{panel.title}: {sorted(names - known)} is no metric kvtier records, writes or scrapes"
        groups = {"spark", "storage", "router", "monitoring", "l3_evictor", "any"}
        assert panel.hosts and set(panel.hosts) <= groups, panel.title


def test_the_metric_parser_is_not_fooled():
    assert metric_names("1 - 2") == set()
    assert metric_names("time() - kvtier_health_last_run_timestamp_seconds") == {
        "kvtier_health_last_run_timestamp_seconds"
    }
    assert metric_names('sum by (host) (rate(a_total{x="b c"}[5m]))') == {"a_total"}


def test_the_p2p_panel_reads_the_tier_the_health_checks_write():
    written = {c["tier"] for c in h.p2p_checks("spark-1", {"lmcache_status": None}, {"p2p_peers": 1})}
    (p2p,) = [p for p in dashboard.PANELS if p.title.startswith("L1 peer-to-peer")]
    assert written == {"l1_p2p"} and 'tier="l1_p2p"' in p2p.expr


def test_the_health_states_are_the_textfiles():
    for value, (status, _color) in dashboard.HEALTH_STATES.items():
        sample = h.check("spark-1", "l0", status, "X", "", name="x")
        assert re.search(rf"^kvtier_health_status\{{.*\}} {value}$", report.prometheus([sample], {}, now=0), re.M)


def test_the_role_defaults_match_the_dashboards_constants():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["monitoring_l3_mount_point"] == dashboard.L3_MOUNT_POINT
    assert defaults["monitoring_router_backend"] == dashboard.ROUTER_BACKEND


def test_queries_reads_one_entry_per_target():
    board = _committed()

    def targets(panels):
        return sum(len(p.get("targets") or []) + targets(p.get("panels") or []) for p in panels)

    found = dashboard.queries(board)
    assert len(found) == targets(board["panels"]) == len(dashboard.PANELS)
    assert found == [(p.title, p.expr) for p in dashboard.PANELS]
    collapsed = {"panels": [{"type": "row", "title": "r", "panels": board["panels"][1:3]}]}
    assert len(dashboard.queries(collapsed)) == 2


def test_live_expr_substitutes_the_variables():
    assert dashboard.live_expr('up{host=~"$host"} or up{host=~"${host:regex}"}') == 'up{host=~".*"} or up{host=~".*"}'
    assert "$" not in "".join(dashboard.live_expr(expr) for _, expr in dashboard.queries(_committed()))
    with pytest.raises(ValueError, match="unknown_var"):
        dashboard.live_expr("up{x=~'$unknown_var'}")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
def test_every_live_query_is_valid_promql(tmp_path):
    exprs = [dashboard.live_expr(expr) for _, expr in dashboard.queries(_committed())]
    records = [{"record": f"dashboard:check_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    rules = {"groups": [{"name": "dashboard", "rules": records}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    said = checked.stdout + checked.stderr
    assert checked.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in said, said
