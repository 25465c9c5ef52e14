"""Telemetry without a broker: trace context, tracing modes and sampling, metrics, settings, ``top``'s
arithmetic, and the backlog's token estimate."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from agentstream.ops.top import parse, render, row, total
from agentstream.streams.config.alerts import AlertSettings
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import StackPaths
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.events import InferenceRequested, Message
from agentstream.streams.runtime.records import Context, Record
from agentstream.streams.telemetry import trace_context as header
from agentstream.streams.telemetry.backlog import PROMPT_TOKENS_HEADER, estimate_prompt_tokens, record_tokens
from agentstream.streams.telemetry.http import MetricsServer
from agentstream.streams.telemetry.metrics import Metrics
from agentstream.streams.telemetry.tracing import Tracing, format_traceparent, parse_traceparent

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_traceparent_parses_and_formats_back():
    ctx = parse_traceparent(TP)
    assert ctx is not None and ctx.is_remote and ctx.trace_flags.sampled
    assert format_traceparent(ctx) == TP
    for bad in (None, "", "garbage", TP[:-1], TP.replace("0af7", "zzzz"), "00-" + "0" * 32 + "-b7ad6b7169203331-01"):
        assert parse_traceparent(bad) is None


def _record(traceparent: str | None) -> Record:
    headers = {header.HEADER: traceparent.encode()} if traceparent else {}
    return Record(topic="t", partition=0, offset=1, key=b"k", timestamp_ms=0, headers=headers,
                  consumed_at=datetime.now(UTC))


def test_with_tracing_off_emitted_events_stay_in_the_trace():
    ctx = Context(runtime=None, service="s", record=_record(TP))  # type: ignore[arg-type]
    assert header.trace_id(ctx.out_traceparent) == header.trace_id(TP)
    assert ctx.out_traceparent != TP and ctx.out_traceparent.endswith("-01")
    orphan = Context(runtime=None, service="s", record=_record(None))  # type: ignore[arg-type]
    assert parse_traceparent(orphan.out_traceparent) is not None


def test_record_spans_follow_the_parent_and_its_sampling_decision():
    memory = InMemorySpanExporter()
    tracing = Tracing.from_settings(TelemetrySettings(tracing="file", sample=1.0), exporter=memory)
    assert tracing is not None
    span, out = tracing.start_record_span("tools", "ToolCallRequested", TP, {"agentstream.run_id": "r"})
    assert span is not None and out == format_traceparent(span.get_span_context())
    span.set_attributes({"agentstream.tool": "calculator"})
    span.end()
    tracing.force_flush()
    [finished] = memory.get_finished_spans()
    assert finished.name == "tools ToolCallRequested" and finished.kind.name == "CONSUMER"
    assert finished.context.trace_id == int(TP[3:35], 16) and finished.parent.span_id == int(TP[36:52], 16)
    assert finished.attributes == {"agentstream.run_id": "r", "agentstream.tool": "calculator"}
    assert finished.resource.attributes["service.name"] == "agentstream"
    # a run its root decided not to trace is not traced anywhere (ParentBased), yet its trace propagates
    unsampled = TP[:-2] + "00"
    quiet, out = tracing.start_record_span("tools", "ToolCallRequested", unsampled, {})
    assert quiet is None and out[3:35] == TP[3:35] and out.endswith("-00") and out[36:52] != TP[36:52]
    # a record without a parent starts a trace of its own (sampled by the ratio: 1.0 here)
    orphan, out = tracing.start_record_span("tools", "ToolCallRequested", None, {})
    assert orphan is not None and orphan.parent is None and out.endswith("-01")
    orphan.end()
    # a tool's execution: a span inside the record's span
    child = tracing.start_child("tool calculator", orphan)
    child.end()
    tracing.shutdown()
    spans = memory.get_finished_spans()
    [tool] = [s for s in spans if s.name == "tool calculator"]
    assert len(spans) == 3 and tool.parent.span_id == orphan.get_span_context().span_id


def test_roots_without_a_parent_follow_the_ratio():
    tracing = Tracing(InMemorySpanExporter(), sample=0.25, batch=False)
    sampled = sum(tracing.start_record_span("s", "E", None, {})[0] is not None for _ in range(4000))
    assert 800 < sampled < 1200
    tracing.shutdown()


def test_sample_zero_traces_no_root():
    memory = InMemorySpanExporter()
    tracing = Tracing.from_settings(TelemetrySettings(tracing="file", sample=0.0), exporter=memory)
    assert tracing is not None
    value = tracing.root_traceparent()
    assert int(value[-2:], 16) & 1 == 0  # not sampled (bit 1, "random trace id", may be set)
    tracing.shutdown()
    assert memory.get_finished_spans() == ()


def test_file_exporter_writes_one_json_object_per_span(tmp_path):
    path = tmp_path / "traces.jsonl"
    tracing = Tracing.from_settings(TelemetrySettings(tracing="file", trace_file=path))
    assert tracing is not None
    root = tracing.root_traceparent()
    span, _ = tracing.start_record_span("planner", "TaskSubmitted", root, {"agentstream.run_id": "run-1"})
    assert span is not None
    span.end()
    tracing.shutdown()  # ends the unclaimed root, flushes
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["name"] for r in lines} == {"submit", "planner TaskSubmitted"}
    child = next(r for r in lines if r["name"] == "planner TaskSubmitted")
    assert child["parent_id"] == root[36:52] and child["trace_id"] == root[3:35]
    assert child["attributes"]["agentstream.run_id"] == "run-1" and child["kind"] == "CONSUMER"


def test_tracing_off_means_no_provider():
    assert Tracing.from_settings(TelemetrySettings()) is None


def test_settings_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("AGENTSTREAM_TRACING", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    monkeypatch.setenv("AGENTSTREAM_TRACE_SAMPLE", "0.1")
    monkeypatch.setenv("AGENTSTREAM_METRICS_PORT", "9464")
    t = Settings.load(StackPaths.from_env()).telemetry
    assert (t.tracing, t.otlp_endpoint, t.sample, t.metrics_port) == ("otlp", "http://collector:4318/v1/traces", 0.1,
                                                                      9464)
    assert t.trace_path() == tmp_path / "traces.jsonl"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:4318/v1/traces")
    assert TelemetrySettings.load().otlp_endpoint == "http://other:4318/v1/traces"
    for name, bad in (("AGENTSTREAM_TRACING", "jaeger"), ("AGENTSTREAM_TRACE_SAMPLE", "2"),
                      ("AGENTSTREAM_METRICS_PORT", "http")):
        with monkeypatch.context() as m:
            m.setenv(name, bad)
            with pytest.raises(ConfigError, match=name):
                TelemetrySettings.load()
    monkeypatch.setenv("AGENTSTREAM_METRICS_PORT", "off")
    assert TelemetrySettings.load().metrics_port is None


def test_metrics_bind_loopback_unless_configured(monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_METRICS_HOST", raising=False)
    assert TelemetrySettings().metrics_host == "127.0.0.1" == TelemetrySettings.load().metrics_host
    monkeypatch.setenv("AGENTSTREAM_METRICS_HOST", "0.0.0.0")
    assert TelemetrySettings.load().metrics_host == "0.0.0.0"


async def test_the_metrics_server_listens_on_loopback_by_default():
    server = MetricsServer(Metrics().registry, lambda: (True, "ready"), port=0)
    await server.start()
    try:
        assert server._runner is not None
        assert {address[0] for address in server._runner.addresses} == {"127.0.0.1"}
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
    finally:
        await server.stop()


def test_alert_thresholds_from_the_environment(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_ALERT_TOOL_SLOW_S", "8, http_get=2.5,sleep=1")
    monkeypatch.setenv("AGENTSTREAM_ALERT_MODEL_STEP_S", "12")
    monkeypatch.setenv("AGENTSTREAM_ALERT_TOOL_FAILURE_RATE", "0.25")
    a = AlertSettings.load()
    assert (a.tool_slow_s, a.tool_threshold_s("http_get"), a.tool_threshold_s("sleep"), a.tool_threshold_s("x")) == (
        8.0, 2.5, 1.0, 8.0)
    assert (a.model_step_s, a.tool_failure_rate) == (12.0, 0.25)
    monkeypatch.setenv("AGENTSTREAM_ALERT_TOOL_SLOW_S", "sleep=fast")
    with pytest.raises(ConfigError, match="AGENTSTREAM_ALERT_TOOL_SLOW_S"):
        AlertSettings.load()


def test_metrics_children_are_created_once():
    metrics = Metrics(process=False)
    service = metrics.service("tools", in_flight=lambda: 3)
    assert metrics.service("tools") is service
    assert service.handled("ToolCallRequested") is service.handled("ToolCallRequested")
    service.handled("ToolCallRequested").observe(0.002)
    service.emitted(InferenceRequested).inc()
    service.dead_letter("handler_error").inc()
    text = generate_latest(metrics.registry).decode()
    assert 'agentstream_handle_seconds_count{event_type="ToolCallRequested",service="tools"} 1.0' in text
    assert 'agentstream_in_flight{service="tools"} 3.0' in text
    assert 'agentstream_dead_letters_total{reason="handler_error",service="tools"} 1.0' in text


def test_prompt_token_estimate_and_header():
    event = InferenceRequested.build(run_id="r", step="r:0:model", service="planner",
                                     messages=[Message(role="system", content="x" * 400),
                                               Message(role="user", content="y" * 40)])
    assert estimate_prompt_tokens(event) == 110 + 8
    assert record_tokens(((PROMPT_TOKENS_HEADER, b"123"),), b"v" * 1000) == 123
    assert record_tokens((), b"v" * 1000) == 250  # published without the header: bytes / 4


BEFORE = """
agentstream_worker_info{services="planner,tools",instance="h:1",topic_prefix=""} 1.0
agentstream_handle_seconds_count{service="planner",event_type="TaskSubmitted"} 10.0
agentstream_handle_seconds_count{service="planner",event_type="ToolCallCompleted"} 10.0
agentstream_handle_seconds_count{service="tools",event_type="ToolCallRequested"} 10.0
agentstream_events_emitted_total{service="planner",event_type="RunCompleted"} 5.0
agentstream_ttft_seconds_count 4.0
agentstream_ttft_seconds_sum 0.4
agentstream_completion_tokens_total 100.0
agentstream_prompt_tokens_total 1000.0
agentstream_cached_prompt_tokens_total 0.0
agentstream_handler_errors_total{service="tools"} 1.0
"""
AFTER = """
agentstream_worker_info{services="planner,tools",instance="h:1",topic_prefix=""} 1.0
agentstream_handle_seconds_count{service="planner",event_type="TaskSubmitted"} 30.0
agentstream_handle_seconds_count{service="planner",event_type="ToolCallCompleted"} 30.0
agentstream_handle_seconds_count{service="tools",event_type="ToolCallRequested"} 30.0
agentstream_events_emitted_total{service="planner",event_type="RunCompleted"} 15.0
agentstream_events_emitted_total{service="planner",event_type="RunFailed"} 2.0
agentstream_ttft_seconds_count 8.0
agentstream_ttft_seconds_sum 1.2
agentstream_completion_tokens_total 300.0
agentstream_prompt_tokens_total 2000.0
agentstream_cached_prompt_tokens_total 750.0
agentstream_handler_errors_total{service="tools"} 3.0
agentstream_consumer_lag{service="tools",topic="agent.tool.requests",partition="0"} 7.0
agentstream_consumer_lag{service="tools",topic="agent.tool.requests",partition="1"} 5.0
"""


def test_top_computes_rates_between_two_scrapes():
    r = row(parse("http://h:1/metrics", BEFORE, at=0.0), parse("http://h:1/metrics", AFTER, at=2.0))
    assert r.name == "h:1" and r.services == "planner,tools"
    assert r.steps_per_s == {"planner": 20.0, "inference": 0.0, "retrieval": 0.0, "tools": 10.0}
    assert r.runs_per_s == 6.0  # (10 completed + 2 failed) / 2 s
    assert r.lag == 12 and r.ttft_ms == pytest.approx(200.0) and r.tokens_per_s == 100.0
    assert r.cache_hit == 0.75 and r.errors_per_s == 1.0 and r.errors_total == 3.0
    t = total([r, r])
    assert t.steps_per_s["planner"] == 40.0 and t.lag == 24
    from rich.console import Console

    console = Console(record=True, width=250)
    console.print(render([r, r]))
    text = console.export_text()
    assert "h:1" in text and "total" in text and "75%" in text


def test_the_processes_tracing_is_an_object_not_module_globals():
    """The process's tracing, stage clock and root-span hook live on explicit objects (``PROCESS``,
    ``ROOTS``), handed down through the ``Runtime``: no module rebinds a global."""
    import ast
    import inspect

    from agentstream.streams.telemetry import stages, trace_context, tracing

    for module in (tracing, stages, trace_context):
        tree = ast.parse(inspect.getsource(module))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], module.__name__


def test_installing_tracing_makes_new_runs_root_spans(monkeypatch):
    from agentstream.streams.telemetry import tracing as telemetry_tracing

    monkeypatch.setattr(header, "ROOTS", header.RootSpans())
    monkeypatch.setattr(telemetry_tracing, "PROCESS", telemetry_tracing.ProcessTracing())
    memory = InMemorySpanExporter()
    installed = Tracing(memory, batch=False)
    telemetry_tracing.install(installed)
    assert telemetry_tracing.tracing_for(TelemetrySettings()) is installed  # the first configuration wins
    root = header.new_traceparent()
    assert installed.claim_root(root) is not None  # a root span, waiting for its task to be sent
    telemetry_tracing.install(None)
    assert telemetry_tracing.process_tracing() is None
    assert installed.claim_root(header.new_traceparent()) is None  # random ids again
    installed.shutdown()
