"""The Grafana dashboard and the alert rules stay true to the metrics taskline exports.

The committed dashboard JSON must be exactly what grafana/dashboard.py generates (nobody edits
it by hand), every panel must have a title and a real query, and every metric and label named
in a panel query or an alert expression must exist: in `taskline.metrics` (the contract, with
the `_total`, `_bucket`, `_sum`, `_count` sample suffixes prometheus-client adds) or in the list
of Prometheus and exporter metrics below. Renaming a metric or a label breaks this test instead
of silently blanking a panel or muting an alert.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from grafana import dashboard
from taskline import metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ROWS = ["Queue depths", "Throughput and latency", "Reliability", "Self-healing", "Infrastructure",
        "Dispatch mode"]

# Metrics that Prometheus itself, redis_exporter and postgres_exporter export; their labels are
# not checked (they are the exporters' to define).
EXPORTER_METRICS = frozenset({
    "up",
    "redis_up", "redis_memory_used_bytes", "redis_memory_max_bytes", "redis_connected_clients",
    "pg_up", "pg_stat_database_numbackends", "pg_settings_max_connections",
    "pg_stat_database_xact_commit", "pg_stat_database_xact_rollback",
})
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created")}


def _taskline_series() -> dict[str, frozenset[str]]:
    """Every sample name taskline exports, with the labels it carries."""
    series: dict[str, frozenset[str]] = {}
    for metric in [*vars(metrics).values(), *vars(metrics.maintenance()).values()]:
        if not isinstance(metric, MetricWrapperBase):
            continue
        family = metric.describe()[0]
        # prometheus-client offers the label names of a metric only through this attribute.
        labels = TARGET_LABELS | set(metric._labelnames)
        for suffix in SUFFIXES[family.type]:
            series[family.name + suffix] = frozenset(labels | ({"le"} if suffix == "_bucket"
                                                               else set()))
    return series


SERIES = _taskline_series()


def _selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []
    promql_parser.walk(expr, lambda node: found.append(node)
                       if isinstance(node, promql_parser.VectorSelector) else None)
    return found


def _aggregations(expr: promql_parser.Expr) -> list[promql_parser.AggregateExpr]:
    found: list[promql_parser.AggregateExpr] = []
    promql_parser.walk(expr, lambda node: found.append(node)
                       if isinstance(node, promql_parser.AggregateExpr) else None)
    return found


def unknown_metrics(expr: str) -> list[str]:
    """Metric names in `expr` that neither taskline nor a known exporter exports."""
    names = [selector.name or "" for selector in _selectors(promql_parser.parse(expr))]
    return [name or "<unnamed selector>" for name in names
            if name not in SERIES and name not in EXPORTER_METRICS]


def _matcher_problems(selector: promql_parser.VectorSelector) -> list[str]:
    labels = SERIES.get(selector.name or "")
    if labels is None:
        return []
    matchers = list(selector.matchers.matchers)
    for group in selector.matchers.or_matchers:
        matchers += list(group)
    return [f"{selector.name} has no label {m.name}" for m in matchers
            if m.name != "__name__" and m.name not in labels]


def _grouping_problems(agg: promql_parser.AggregateExpr) -> list[str]:
    if agg.modifier is None or agg.modifier.type != promql_parser.AggModifierType.By:
        return []
    inner = [selector.name or "" for selector in _selectors(agg.expr)]
    if not inner or any(name not in SERIES for name in inner):
        return []
    available = frozenset().union(*(SERIES[name] for name in inner))
    return [f"by ({label}) over {', '.join(sorted(set(inner)))} that lack it"
            for label in agg.modifier.labels if label not in available]


def unknown_labels(expr: str) -> list[str]:
    """Label matchers and `by` groupings in `expr` that name a label taskline does not set."""
    tree = promql_parser.parse(expr)
    problems = [p for selector in _selectors(tree) for p in _matcher_problems(selector)]
    return problems + [p for agg in _aggregations(tree) for p in _grouping_problems(agg)]


def _alert_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [(rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


def _json_panels() -> list[dict]:
    return json.loads(dashboard.OUTPUT.read_text())["panels"]


EXPRESSIONS = [(f"panel {title}", expr) for title, expr in dashboard.panel_expressions()] + [
    (f"alert {name}", expr) for name, expr in _alert_expressions()]


def test_committed_dashboard_is_generated() -> None:
    assert dashboard.OUTPUT.read_text() == dashboard.render(), (
        "grafana/dashboards/taskline.json differs from grafana/dashboard.py: run make dashboard")


def test_dashboard_has_the_rows_an_operator_expects() -> None:
    assert [p["title"] for p in _json_panels() if p["type"] == "row"] == ROWS


def test_every_panel_has_a_title_and_a_query() -> None:
    panels = [p for p in _json_panels() if p["type"] != "row"]
    assert len(panels) >= 30
    for panel in panels:
        assert panel["title"].strip() and panel["description"].strip()
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], panel["title"]


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    panels = _json_panels()
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        covered = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                   for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered


def test_panel_expressions_are_what_grafana_runs() -> None:
    in_json = [(p["title"], t["expr"]) for p in _json_panels() for t in p.get("targets", [])]
    assert dashboard.panel_expressions() == in_json


def test_panel_expressions_are_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs it (apt-get install prometheus)"
    rules = [{"record": f"taskline:panel_{i}", "expr": expr}
             for i, (_, expr) in enumerate(dashboard.panel_expressions())]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("source", "expr"), EXPRESSIONS, ids=[s for s, _ in EXPRESSIONS])
def test_every_metric_and_label_exists(source: str, expr: str) -> None:
    assert unknown_metrics(expr) == []
    assert unknown_labels(expr) == []


def test_a_renamed_metric_or_label_is_caught() -> None:
    assert unknown_metrics("sum(rate(job_enqueued[5m]))") == ["job_enqueued"]
    assert unknown_metrics('rate({__name__="job_enqueued_total"}[5m])') == ["<unnamed selector>"]
    assert unknown_metrics("histogram_quantile(0.9, rate(job_wait_time_seconds_bucket[1m]))") == []
    assert unknown_labels('job_dlq_depth{type="email"}') == ["job_dlq_depth has no label type"]
    assert unknown_labels("sum by (reason) (rate(job_retried_total[5m]))") != []
    assert unknown_labels("sum by (le, queue) (rate(job_wait_time_seconds_bucket[5m]))") == []
