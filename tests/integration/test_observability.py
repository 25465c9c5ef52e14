"""Observability end to end on the real broker and database: one run is one trace across every Kafka
hop, metrics move when work is done, /readyz waits for the model and the group, an alert fires when a
tool is slower than its threshold, and ``agentstream top --once`` shows the worker."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

import aiohttp
import pytest
import pytest_asyncio
from aiokafka import TopicPartition
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console
from typer.testing import CliRunner

from agentstream.cli import app as cli_app
from agentstream.ops.top import parse, run_top
from agentstream.services import worker as worker_module
from agentstream.services.alerts.app import AlertsApp
from agentstream.services.inference.backends.scripted import ScriptedBackend
from agentstream.services.worker import Worker, WorkerOptions
from agentstream.streams.config.alerts import AlertSettings
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.core.events import AlertRaised
from agentstream.streams.telemetry import tracing as telemetry_tracing
from agentstream.streams.telemetry.discovery import discover
from agentstream.streams.telemetry.tracing import Tracing, span_record
from agentstream.testing import Pipeline, end_offsets, isolated, read_events
from tests.integration.partition_reads import read_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")


@pytest.fixture(scope="module")
def exporter():
    """Every span of this module, in memory, exported as each span ends."""
    memory = InMemorySpanExporter()
    tracing = Tracing(memory, batch=False)
    telemetry_tracing.install(tracing)  # the client's root spans, too
    yield memory, tracing
    telemetry_tracing.install(None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table, exporter):
    _memory, tracing = exporter
    telemetry = TelemetrySettings(metrics_port=0, metrics_host="127.0.0.1", sample_interval_s=0.3)
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS, tracing=tracing)
    s = replace(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), telemetry=telemetry)
    async with Pipeline.start(s, options) as pipeline:
        yield pipeline


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def _spans(memory: InMemorySpanExporter, trace_id: str) -> list[dict]:
    return [r for r in (span_record(s) for s in memory.get_finished_spans()) if r["trace_id"] == trace_id]


async def test_a_run_is_one_trace_with_each_hop_parented_by_its_producer(pipe, exporter):
    memory, _ = exporter
    run_id = await pipe.client.submit("What is 17 * 23?", tools=["calculator"], max_steps=5)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok, result
    await asyncio.sleep(0.3)  # the retrieval prefetch may answer after the run ended

    mine = [r for r in map(span_record, memory.get_finished_spans())
            if r["attributes"].get("agentstream.run_id") == run_id]
    roots = [r for r in mine if r["name"] == "submit TaskSubmitted"]
    assert len(roots) == 1 and roots[0]["parent_id"] is None, mine
    trace_id = roots[0]["trace_id"]
    assert {r["trace_id"] for r in mine} == {trace_id}  # every span of the run: one trace

    spans = _spans(memory, trace_id)
    by_id = {r["span_id"]: r for r in spans}
    names = sorted(r["name"] for r in spans)
    for expected in ("planner TaskSubmitted", "inference InferenceRequested", "tools ToolCallRequested",
                     "planner InferenceCompleted", "planner ToolCallCompleted", "tool calculator",
                     "retrieval RetrievalRequested"):
        assert expected in names, names
    produced_by = {  # the span that handled X emitted the event handled by a span named Y: Y's parent is X
        "planner TaskSubmitted": {"submit TaskSubmitted"},
        "inference InferenceRequested": {"planner TaskSubmitted", "planner ToolCallCompleted"},
        "tools ToolCallRequested": {"planner InferenceCompleted"},
        "retrieval RetrievalRequested": {"planner TaskSubmitted"},
        "planner InferenceCompleted": {"inference InferenceRequested"},
        "planner ToolCallCompleted": {"tools ToolCallRequested"},
        "planner RetrievalCompleted": {"retrieval RetrievalRequested"},
        "tool calculator": {"tools ToolCallRequested"},
    }
    for span in spans:
        if span["name"] == "submit TaskSubmitted":
            continue
        parent = by_id.get(span["parent_id"])
        assert parent is not None, f"{span['name']}: parent {span['parent_id']} is not in the trace"
        assert parent["name"] in produced_by[span["name"]], (span["name"], parent["name"])
        if span["name"].startswith("planner ") and span["name"].endswith("Completed"):
            # a result's handling is the child of the handling of the very request it answers
            assert parent["attributes"]["agentstream.step_id"] == span["attributes"]["agentstream.step_id"]
        if span["kind"] == "CONSUMER":
            attrs = span["attributes"]
            assert attrs["messaging.destination.name"].startswith(pipe.settings.topic_prefix)
            assert attrs["messaging.kafka.offset"] >= 0 and attrs["agentstream.queue_wait_ms"] >= 0
    model = next(r for r in spans if r["name"] == "inference InferenceRequested")
    assert model["attributes"]["gen_ai.usage.output_tokens"] > 0


async def test_metrics_move_when_work_is_done_and_the_worker_is_ready(pipe):
    url = pipe.worker.metrics_url
    assert url is not None
    health = url.replace("/metrics", "/healthz")
    ready = url.replace("/metrics", "/readyz")
    assert (await _get(health))[0] == 200
    assert (await _get(ready))[0] == 200
    before = parse(url, (await _get(url))[1])
    run_ids = [await pipe.client.submit(f"What is {i} * 3?", tools=["calculator"]) for i in range(3)]
    assert all(r.ok for r in await asyncio.gather(*(pipe.client.wait(r, timeout=30) for r in run_ids)))
    await asyncio.sleep(0.8)  # a lag sample or two
    after = parse(url, (await _get(url))[1])

    def grew(name: str, by: float = 1, **labels: str) -> None:
        assert after.total(name, **labels) - before.total(name, **labels) >= by, (name, labels)

    grew("agentstream_handle_seconds_count", 3, service="planner", event_type="TaskSubmitted")
    grew("agentstream_handle_seconds_count", 6, service="inference")
    grew("agentstream_handle_seconds_count", 3, service="tools")
    grew("agentstream_queue_wait_seconds_count", 3, service="tools")
    grew("agentstream_events_emitted_total", 3, service="planner", event_type="RunCompleted")
    grew("agentstream_tool_calls_total", 3, tool="calculator", outcome="ok")
    grew("agentstream_step_seconds_count", 6, kind="model")
    grew("agentstream_completion_tokens_total", 6)
    grew("agentstream_prompt_tokens_total", 6)
    # sampled, not per message: lag per assigned partition of every service, and the backlog gauge
    lag_topics = {labels["topic"] for labels, _ in after.samples["agentstream_consumer_lag"]}
    assert pipe.worker.runtime.topics.inference_requests in lag_topics
    assert after.total("agentstream_consumer_lag") >= 0
    assert "agentstream_inference_backlog_prompt_tokens" in after.samples
    assert after.total("agentstream_in_flight", service="planner") >= 0


async def test_the_backlog_counts_prompt_tokens_waiting_for_inference(pipe):
    """With inference paused, requests pile up: the sampler reports their estimated prompt tokens."""
    sampler = pipe.worker.backlog
    assert sampler is not None
    inference = next(r for r in pipe.worker.runners if r.config.name == "inference")
    tokens0, requests0 = await sampler.sample()
    inference.consumer.pause(*inference.consumer.assignment())
    try:
        runs = [await pipe.client.submit(f"What is {i} + 100? " + "Please be careful. " * 20,
                                         tools=["calculator"], prefetch=False) for i in range(4)]
        for _ in range(50):
            tokens, requests = await sampler.sample()
            if requests >= requests0 + 4:
                break
            await asyncio.sleep(0.1)
        assert requests >= requests0 + 4
        assert tokens - tokens0 >= 4 * 100  # each task is > 400 characters
    finally:
        inference.consumer.resume(*inference.consumer.assignment())
    assert all(r.ok for r in await asyncio.gather(*(pipe.client.wait(r, timeout=30) for r in runs)))
    for _ in range(50):
        tokens, requests = await sampler.sample()
        if requests == 0:
            break
        await asyncio.sleep(0.1)
    assert (tokens, requests) == (0, 0)


async def test_alerts_fire_for_a_slow_tool_and_a_lagging_group(pipe, tmp_path):
    thresholds = AlertSettings(tool_slow_s=30.0, tool_slow_overrides={"sleep": 0.2}, window_s=60.0,
                               lag_records=2, lag_interval_s=3600.0)
    alerts = AlertsApp(pipe.settings, thresholds, from_start=True, datadir=tmp_path / "faust")
    topics = pipe.worker.runtime.topics
    tp = TopicPartition(topics.alerts, 0)
    start = (await end_offsets(pipe.settings, [tp]))[tp]
    inference = next(r for r in pipe.worker.runners if r.config.name == "inference")
    await alerts.start()
    try:
        fast = await pipe.client.submit('[[tool:sleep {"seconds": 0.01}]] [[answer:ok]]', tools=["sleep"])
        slow = await pipe.client.submit('[[tool:sleep {"seconds": 0.5}]] [[answer:ok]]', tools=["sleep"])
        assert (await pipe.client.wait(fast, timeout=30)).ok and (await pipe.client.wait(slow, timeout=30)).ok
        slow_alerts = await read_events(pipe.settings, tp, start, expect=1, timeout=30)

        # consumer lag: hold the inference group back while requests arrive
        inference.consumer.pause(*inference.consumer.assignment())
        try:
            held = [await pipe.client.submit(f"What is {i} - 1?", tools=["calculator"], prefetch=False)
                    for i in range(4)]
            lag_alerts: list[AlertRaised] = []
            for _ in range(50):
                lag_alerts = [a for a in await alerts.check_lag() if a.subject.endswith(topics.inference_requests)]
                if lag_alerts:
                    break
                await asyncio.sleep(0.2)
        finally:
            inference.consumer.resume(*inference.consumer.assignment())
        assert all(r.ok for r in await asyncio.gather(*(pipe.client.wait(r, timeout=30) for r in held)))
    finally:
        await alerts.stop()
    assert len(slow_alerts) == 1, slow_alerts
    alert = slow_alerts[0]
    assert isinstance(alert, AlertRaised)
    assert (alert.kind, alert.subject, alert.run_id) == ("slow_tool", "sleep", slow)
    assert alert.value >= 0.5 and alert.threshold == 0.2 and alert.window_start is not None
    assert alert.parent_step_id is not None and alert.parent_step_id.startswith(slow)
    assert len(lag_alerts) == 1 and lag_alerts[0].kind == "consumer_lag" and lag_alerts[0].value > 2
    published = await read_until(pipe.settings, [tp], lambda events: lag_alerts[0].event_id in
                                 {e.event_id for e in events}, start=start)
    assert lag_alerts[0].event_id in {e.event_id for e in published}


async def test_top_once_shows_the_registered_worker(pipe, settings):
    registered = await discover(pipe.settings.database_url, pipe.settings.topic_prefix)
    assert [url for url, _ in registered] == [pipe.worker.metrics_url]
    assert sorted(registered[0][1]) == sorted(pipe.worker.names)
    run_id = await pipe.client.submit("What is 2 + 2?", tools=["calculator"])
    console = Console(record=True, width=250)
    waiting = asyncio.create_task(pipe.client.wait(run_id, timeout=30))
    assert await run_top(None, 0.5, True, console, settings=pipe.settings) == 0
    await waiting
    text = console.export_text()
    assert pipe.worker.metrics_url.removeprefix("http://").removesuffix("/metrics") in text
    assert "planner" in text and "steps/s" in text

    endpoint = pipe.worker.metrics_url.removeprefix("http://").removesuffix("/metrics")
    out = await asyncio.to_thread(CliRunner().invoke, cli_app, ["top", "--endpoints", endpoint, "--once",
                                                                "--interval", "0.2"])
    assert out.exit_code == 0, out.output
    assert endpoint in out.output


class GatedBackend(ScriptedBackend):
    """The scripted model, whose start() (loading the model) waits until the test opens the gate."""

    gate: asyncio.Event | None = None

    async def start(self) -> None:
        assert GatedBackend.gate is not None
        await GatedBackend.gate.wait()


async def test_readyz_waits_for_the_model_and_the_group(settings, monkeypatch):
    monkeypatch.setitem(worker_module.BACKENDS, "gated", (__name__, "GatedBackend", "the test"))
    GatedBackend.gate = asyncio.Event()
    s = replace(isolated(settings, f"t{uuid.uuid4().hex[:8]}."),
                telemetry=TelemetrySettings(metrics_port=0, metrics_host="127.0.0.1"))
    worker = Worker(["inference"], s, WorkerOptions(backend="gated"))
    stop = asyncio.Event()
    starting = asyncio.create_task(worker.start())
    running = None
    try:
        url = None
        for _ in range(100):
            if worker.metrics_server is not None and worker.metrics_server.port:
                url = worker.metrics_url.replace("/metrics", "/readyz")
                status, text = await _get(url)
                if "loading the model" in text:
                    break
            await asyncio.sleep(0.1)
        assert url is not None
        status, text = await _get(url)
        assert status == 503 and "loading the model" in text, text
        assert (await _get(url.replace("/readyz", "/healthz")))[0] == 200  # alive, just not ready
        GatedBackend.gate.set()
        await starting
        running = asyncio.create_task(worker.run(stop))
        t0 = time.monotonic()
        while (await _get(url))[0] != 200:
            assert time.monotonic() - t0 < 30, await _get(url)
            await asyncio.sleep(0.1)
        assert worker.runners[0].joined
    finally:
        GatedBackend.gate.set()
        stop.set()
        if not starting.done():
            starting.cancel()
        if running is not None:
            await running
        await worker.close()
