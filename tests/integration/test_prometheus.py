"""The monitoring files against a real Prometheus: promtool checks the scrape configs and the rules and
runs the rules' unit tests, then a Prometheus server scrapes real worker processes (planner, inference
on the scripted backend, tools) on the session's Kafka and PostgreSQL, and the slow-step alert of the
shipped infra/prometheus/rules.yml fires when a tool takes its time, while the dead-letter and
worker-down alerts stay quiet.

Needs Prometheus 2.x (`prometheus`, `promtool`; Debian: `apt-get install prometheus`); skipped without.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agentstream.devstack.process import free_port
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import isolated
from tests.integration.processes import ROOT, start_worker, stop

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
CONFIG_DIR = ROOT / "infra" / "prometheus"
DASHBOARD = ROOT / "infra" / "grafana" / "agentstream.json"
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "15s", "$job": "agentstream.*"}
#: Dashboard panels that must show data once the test's workers have run a step with a tool.
PANELS_WITH_DATA = {"Workers up and ready", "Steps/s by service", "Step latency p50 / p99 by service",
                    "Step duration p50 / p99 by kind", "Tool calls by outcome", "Consumer lag by group",
                    "Inference token backlog", "Inference tokens/s", "Runs completed / failed"}
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (it comes with Prometheus; "
                                                              "Debian: apt-get install prometheus)")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="prometheus is not installed (Debian: apt-get install prometheus)")

#: The test variant of the shipped rules: what differs, and only that (the rest is rules.yml as it is).
SLOW_STEPS = "AgentstreamSlowSteps"
SLOW_STEPS_THRESHOLD_S = 0.5  # shipped: 30 s; the test's slow tool sleeps 2 s
SLOW_STEPS_FOR = "1s"  # shipped: 10m
SLOW_TOOL_S = 2.0


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=CONFIG_DIR)


@needs_promtool
def test_promtool_checks_the_config_and_the_rules():
    config = _promtool("check", "config", CONFIG_DIR / "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS" in config.stdout
    rules = _promtool("check", "rules", CONFIG_DIR / "rules.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert re.search(r"SUCCESS: \d+ rules found", rules.stdout), rules.stdout


@needs_promtool
def test_promtool_runs_the_rules_unit_tests():
    result = _promtool("test", "rules", CONFIG_DIR / "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    # every alert of rules.yml is fired by at least one test case
    alerts = {r["alert"] for g in yaml.safe_load((CONFIG_DIR / "rules.yml").read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((CONFIG_DIR / "rules_test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts - fired == set(), "alerts no unit test fires"


@needs_promtool
def test_promtool_checks_the_kubernetes_config(tmp_path):
    """prometheus-k8s.yml discovers pods through the Kubernetes API, which Debian's build leaves out: with
    such a promtool the file is checked with its kubernetes_sd_configs swapped for an empty static list
    (everything else — relabelling regexes, rule files — is checked as it is)."""
    source = CONFIG_DIR / "prometheus-k8s.yml"
    config = yaml.safe_load(source.read_text())
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["agentstream"]}}]
    annotations = {a for r in job["relabel_configs"] for a in r.get("source_labels", [])
                   if a.startswith("__meta_kubernetes_pod_annotation_prometheus_io_")}
    assert annotations == {f"__meta_kubernetes_pod_annotation_prometheus_io_{k}" for k in ("scrape", "port", "path")}
    result = _promtool("check", "config", source)
    if result.returncode != 0 and "kubernetes_sd_configs not found" in result.stdout + result.stderr:
        job["static_configs"] = [{"targets": []}]
        del job["kubernetes_sd_configs"]
        shutil.copy(CONFIG_DIR / "rules.yml", tmp_path / "rules.yml")
        variant = tmp_path / "prometheus-k8s.yml"
        variant.write_text(yaml.safe_dump(config, sort_keys=False))
        result = _promtool("check", "config", variant)
    assert result.returncode == 0, result.stdout + result.stderr


def _test_rules(target: Path) -> dict[str, Any]:
    """rules.yml with the slow-step rule's threshold and ``for`` made test-sized; returns that rule."""
    rules = yaml.safe_load((CONFIG_DIR / "rules.yml").read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == SLOW_STEPS]
    expr, n = re.subn(r">\s*30\s*$", f"> {SLOW_STEPS_THRESHOLD_S}", rule["expr"].rstrip())
    assert n == 1, f"{SLOW_STEPS} no longer ends with '> 30': update this test: {rule['expr']}"
    rule["expr"], rule["for"] = expr, SLOW_STEPS_FOR
    target.write_text(yaml.safe_dump(rules, sort_keys=False))
    return rule


def _start_prometheus(directory: Path, port: int) -> subprocess.Popen:
    """Prometheus on 127.0.0.1:``port`` with ``directory``/prometheus.yml, its storage and log in ``directory``."""
    assert PROMETHEUS is not None
    with open(directory / "prometheus.log", "ab") as log:
        return subprocess.Popen(
            [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=directory)


async def _get_json(session: aiohttp.ClientSession, url: str, **params: str) -> Any:
    async with session.get(url, params=params) as response:
        body = await response.json()
        assert response.status == 200 and body["status"] == "success", body
        return body["data"]


async def _query(session: aiohttp.ClientSession, api: str, promql: str) -> list[dict[str, Any]]:
    """An instant vector: [{"metric": {labels}, "value": [time, "value"]}, …]."""
    data = await _get_json(session, f"{api}/api/v1/query", query=promql)
    assert data["resultType"] == "vector", data
    return data["result"]


async def _until(what: str, timeout: float, check, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(interval)


@needs_prometheus
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_prometheus_fires_the_slow_step_alert_on_real_workers(settings, tmp_path):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    ports = {service: free_port() for service in ("planner", "inference", "tools")}
    env = {"AGENTSTREAM_METRICS_HOST": "127.0.0.1", "AGENTSTREAM_TELEMETRY_INTERVAL_S": "1"}
    tool_args = [arg for module in TOOLS for arg in ("--tools", module)]
    args = {"planner": [], "inference": ["--backend", "scripted"], "tools": tool_args}

    rule = _test_rules(tmp_path / "rules.yml")
    prom_port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "agentstream-test",
                            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    check = _promtool("check", "config", tmp_path / "prometheus.yml")
    assert check.returncode == 0, check.stdout + check.stderr

    procs: dict[str, subprocess.Popen] = {}
    prometheus: subprocess.Popen | None = None
    api = f"http://127.0.0.1:{prom_port}"
    try:
        for service, port in ports.items():
            procs[service] = start_worker(s, service, tmp_path / f"{service}.log", *args[service],
                                          AGENTSTREAM_METRICS_PORT=str(port), **env)
        prometheus = _start_prometheus(tmp_path, prom_port)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            async def ready(port: int) -> bool:
                for name, proc in procs.items():
                    assert proc.poll() is None, f"the {name} worker exited: {(tmp_path / f'{name}.log').read_text()}"
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            for service, port in ports.items():
                await _until(f"the {service} worker's /readyz", 120, lambda port=port: ready(port))

            async def prometheus_ready() -> bool:
                assert prometheus is not None and prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()
                try:
                    async with http.get(f"{api}/-/ready") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await _until("Prometheus /-/ready", 60, prometheus_ready)

            async def scraped() -> bool:  # every worker up, and the tool step histogram seen at zero
                targets = (await _get_json(http, f"{api}/api/v1/targets"))["activeTargets"]
                series = await _query(http, api, 'agentstream_step_seconds_count{kind="tool"}')
                return len(targets) == 3 and all(t["health"] == "up" for t in targets) and bool(series)

            await _until("Prometheus scraping the three workers", 60, scraped)
            up = await _query(http, api, 'up{job="agentstream-test"}')
            assert sorted(r["value"][1] for r in up) == ["1", "1", "1"]

            async def alerts() -> list[dict[str, Any]]:
                return (await _get_json(http, f"{api}/api/v1/alerts"))["alerts"]

            assert [a for a in await alerts() if a["labels"]["alertname"] == SLOW_STEPS] == []

            async with AgentClient(s) as client:
                run_id = await client.submit(f'[[tool:sleep {{"seconds": {SLOW_TOOL_S}}}]] [[answer:ok]]',
                                             tools=["sleep"], prefetch=False)
                result = await client.wait(run_id, timeout=60)
                assert result.ok, result

            async def slow_step_firing() -> list[dict[str, Any]]:
                return [a for a in await alerts() if a["labels"]["alertname"] == SLOW_STEPS and a["state"] == "firing"]

            firing = await _until(f"{SLOW_STEPS} firing", 60, slow_step_firing)
            everything = await alerts()
            rules = await _get_json(http, f"{api}/api/v1/rules", type="alert")

            # every query of the Grafana dashboard runs on this Prometheus; the main panels show data
            async def dashboard() -> dict[str, list[list[dict[str, Any]]]]:
                panels: dict[str, list[list[dict[str, Any]]]] = {}
                for panel in json.loads(DASHBOARD.read_text())["panels"]:
                    for target in panel.get("targets", []):
                        expr = target["expr"]
                        for variable, value in GRAFANA_VARIABLES.items():
                            expr = expr.replace(variable, value)
                        panels.setdefault(panel["title"], []).append(await _query(http, api, expr))
                return panels

            async def main_panels_with_data() -> dict[str, list[list[dict[str, Any]]]] | None:
                panels = await dashboard()
                return panels if all(any(panels.get(t, ())) for t in PANELS_WITH_DATA) else None

            # rate() needs two scrapes of a series, and the run's RunCompleted counter first exists when
            # the run ends: the alert can fire before its second scrape. Wait for it; on a timeout the
            # assertions below name the panels without data.
            try:
                panels = await _until("the dashboard's main panels showing data", 30, main_panels_with_data)
            except TimeoutError:
                panels = await dashboard()

    finally:
        if prometheus is not None:
            stop(prometheus, timeout=15)
        for proc in procs.values():
            stop(proc)
        await Topics(prefix=s.topic_prefix, partitions=s.partitions).delete_all(s.kafka_bootstrap, auth=s.kafka_auth)

    # the slow tool made the p99 of tool steps cross the (test) threshold; model steps stayed fast
    assert [a["labels"]["kind"] for a in firing] == ["tool"], firing
    alert = firing[0]
    assert alert["labels"]["severity"] == "warning"
    assert float(alert["value"]) > SLOW_STEPS_THRESHOLD_S
    assert "docs/monitoring.md#agentstreamslowsteps" in alert["annotations"]["description"]
    # the rules Prometheus evaluated are the shipped ones, the slow-step rule alone made test-sized
    loaded = {r["name"]: r for g in rules["groups"] for r in g["rules"]}
    shipped = {r["alert"] for g in yaml.safe_load((CONFIG_DIR / "rules.yml").read_text())["groups"] for r in g["rules"]}
    assert set(loaded) == shipped
    assert loaded[SLOW_STEPS]["duration"] == 1 and loaded[SLOW_STEPS]["query"].endswith(f"> {SLOW_STEPS_THRESHOLD_S}")
    assert rule["for"] == SLOW_STEPS_FOR
    assert all(r["health"] == "ok" for r in loaded.values()), [(r["name"], r.get("lastError")) for r in loaded.values()]
    assert PANELS_WITH_DATA <= set(panels)
    assert [t for t in PANELS_WITH_DATA if not any(panels[t])] == [], "dashboard panels without data"
    # unrelated alerts: not even pending (nothing was dead-lettered, every worker was up)
    quiet = {"AgentstreamDeadLetters", "AgentstreamWorkerDown", "AgentstreamToolFailureRate", "AgentstreamConsumerLag"}
    assert [(a["labels"]["alertname"], a["state"]) for a in everything if a["labels"]["alertname"] in quiet] == []
