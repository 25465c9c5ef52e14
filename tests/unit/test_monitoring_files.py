"""The shipped monitoring files name only metrics the workers really export: every PromQL expression of
infra/prometheus/rules.yml and of the Grafana dashboard infra/grafana/agentstream.json uses metric
names (and labels) that streams/telemetry/metrics.py registers, or Prometheus's own ``up``. And every
alert has ``for``, a severity and a runbook section in docs/monitoring.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from agentstream.streams.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "infra" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "infra" / "grafana" / "agentstream.json"
RUNBOOK = ROOT / "docs" / "monitoring.md"

#: Series Prometheus makes itself for every target, and their labels.
PROMETHEUS_SERIES = {"up": {"job", "instance"}}
#: Labels a scrape adds to every series (prometheus.yml, prometheus-k8s.yml's relabelling).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "agentstream_service"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "inf", "nan"}
#: Grafana's variables, replaced by what they stand for before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m", "$job": "agentstream.*"}


def registered() -> dict[str, set[str]]:
    """Every sample name a worker's registry exports, with its label names (one child of each labelled
    family is created so that its samples show)."""
    metrics = Metrics(CollectorRegistry())
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase) and value._labelnames:
            value.labels(*("x" for _ in value._labelnames))
    names: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def parse(expr: str) -> tuple[set[str], set[str], set[str]]:
    """(metric names, label names in selectors, label names in by/without/on/ignoring/group_*) of a
    PromQL expression — a lexer, enough for the expressions these files use."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    expr = _strip_strings(expr)
    selector_labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        selector_labels.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    grouping: set[str] = set()
    for labels in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        grouping.update(label.strip() for label in labels.split(",") if label.strip())
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+\d+[smhdwy]", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        name, call = match.groups()
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names, selector_labels, grouping


def check(expr: str, known: dict[str, set[str]], where: str) -> set[str]:
    names, selector_labels, grouping = parse(expr)
    unknown = names - set(known)
    assert not unknown, f"{where}: {sorted(unknown)} are not metrics the workers export: {expr}"
    assert names, f"{where}: no metric in {expr}"
    labels = set(TARGET_LABELS).union(*(known[n] for n in names))
    assert selector_labels <= labels, f"{where}: labels {sorted(selector_labels - labels)} are on none of {sorted(names)}"
    assert grouping <= labels, f"{where}: grouping by {sorted(grouping - labels)}, on none of {sorted(names)}"
    return names


@pytest.fixture(scope="module")
def known() -> dict[str, set[str]]:
    return {**registered(), **PROMETHEUS_SERIES}


def test_the_registry_has_the_names_the_files_rely_on(known):
    for name in ("agentstream_handle_seconds_bucket", "agentstream_step_seconds_bucket", "agentstream_tool_calls_total",
                 "agentstream_consumer_lag", "agentstream_dead_letters_total",
                 "agentstream_inference_backlog_prompt_tokens", "process_start_time_seconds"):
        assert name in known
    assert known["agentstream_tool_calls_total"] == {"tool", "outcome"}
    assert "le" in known["agentstream_step_seconds_bucket"]


def test_the_lexer_finds_names_and_labels():
    names, selectors, grouping = parse('histogram_quantile(0.99, sum by (kind, le) (rate(a_bucket{job=~"x.*", k!="}"}'
                                       '[5m]))) > 30 and on (job) (up offset 10m or b > time() - 600)')
    assert names == {"a_bucket", "up", "b"}
    assert selectors == {"job", "k"} and grouping == {"kind", "le", "job"}


def test_rules_use_only_registered_metrics_and_have_a_runbook(known):
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    runbook = RUNBOOK.read_text()
    anchors = {re.sub(r"[^a-z0-9_ -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+\s+(.+)$", runbook, flags=re.M)}
    used: set[str] = set()
    for rule in rules:
        name = rule["alert"]
        used |= check(rule["expr"], known, name)
        assert rule.get("for"), f"{name} has no for:"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        anchor = f"docs/monitoring.md#{name.lower()}"
        assert anchor in rule["annotations"]["description"], f"{name}: the description does not name {anchor}"
        assert name.lower() in anchors, f"docs/monitoring.md has no section {name}"
    alerts = {r["alert"] for r in rules}
    assert {"AgentstreamSlowSteps", "AgentstreamToolFailureRate", "AgentstreamConsumerLag", "AgentstreamDeadLetters",
            "AgentstreamInferenceBacklog", "AgentstreamWorkerDown"} <= alerts
    assert {"agentstream_step_seconds_bucket", "agentstream_tool_calls_total", "agentstream_consumer_lag",
            "agentstream_dead_letters_total", "agentstream_inference_backlog_prompt_tokens", "up"} <= used


def _targets(dashboard: dict) -> list[tuple[str, dict]]:
    out = []
    for panel in dashboard["panels"]:
        for child in [panel, *panel.get("panels", [])]:
            out.extend((child["title"], t) for t in child.get("targets", []))
    return out


def test_the_dashboard_uses_only_registered_metrics(known):
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    targets = _targets(dashboard)
    assert targets
    used: set[str] = set()
    for title, target in targets:
        assert target["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, title
        used |= check(target["expr"], known, f"panel {title!r}")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            metric = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert metric and metric[1] in known, query
    # the panels the operators asked for
    for name in ("agentstream_handle_seconds_count", "agentstream_handle_seconds_bucket", "agentstream_tool_calls_total",
                 "agentstream_consumer_lag", "agentstream_dead_letters_total",
                 "agentstream_inference_backlog_prompt_tokens", "agentstream_completion_tokens_total",
                 "agentstream_events_emitted_total", "up"):
        assert name in used, f"no panel shows {name}"
