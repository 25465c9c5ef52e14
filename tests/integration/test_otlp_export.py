"""OTLP export to a real HTTP endpoint: a run's spans, from every service, arrive as OTLP/protobuf
requests (what an OpenTelemetry collector receives) and form one trace. The exporter is the ``otlp``
extra, which ``dev`` includes."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.telemetry import tracing as telemetry_tracing
from agentstream.streams.telemetry.tracing import Tracing
from agentstream.testing import Pipeline, isolated


@contextmanager
def _collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A stand-in for a collector's OTLP/HTTP receiver: it keeps each request's content type and body.
    It serves from a thread and an event loop of its own, as a real collector is another process: the
    worker flushes its spans when it closes with the test's loop blocked, and a receiver on that loop
    answered the flush only after the exporter had given up (10 s, and a batch of spans lost)."""
    received: list[tuple[str, bytes]] = []
    started = threading.Event()
    box: dict = {}

    async def traces(request: web.Request) -> web.Response:
        received.append((request.content_type, await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        box.update(loop=asyncio.get_running_loop(), stop=asyncio.Event(), port=runner.addresses[0][1])
        started.set()
        try:
            await box["stop"].wait()
        finally:
            await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="otlp-collector", daemon=True)
    thread.start()
    assert started.wait(30), "the collector did not start"
    try:
        yield f"http://127.0.0.1:{box['port']}/v1/traces", received
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)


async def test_a_runs_spans_reach_an_otlp_endpoint_as_one_trace(settings):
    with _collector() as (endpoint, received):
        tracing = Tracing.from_settings(TelemetrySettings(tracing="otlp", otlp_endpoint=endpoint))
        assert tracing is not None
        telemetry_tracing.install(tracing)  # the client's root span too
        try:
            async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."),
                                      WorkerOptions(backend="scripted", tracing=tracing)) as pipe:
                run_id = await pipe.client.submit("What is 17 * 23?", tools=["calculator"], max_steps=5,
                                                  prefetch=False)
                assert (await pipe.client.wait(run_id, timeout=30)).ok
            # The exporter posts from its own threads with blocking HTTP.
            await asyncio.to_thread(tracing.shutdown)
        finally:
            telemetry_tracing.install(None)

    assert received and {ctype for ctype, _ in received} == {"application/x-protobuf"}
    spans = [span for _, body in received
             for resource in ExportTraceServiceRequest.FromString(body).resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    mine = [s for s in spans
            if any(a.key == "agentstream.run_id" and a.value.string_value == run_id for a in s.attributes)]
    names = {s.name for s in mine}
    assert {"submit TaskSubmitted", "planner TaskSubmitted", "inference InferenceRequested",
            "tools ToolCallRequested", "planner ToolCallCompleted", "planner InferenceCompleted"} <= names, names
    assert len({s.trace_id for s in mine}) == 1
    by_id = {s.span_id: s for s in mine}
    roots = [s for s in mine if not s.parent_span_id]
    assert [s.name for s in roots] == ["submit TaskSubmitted"]
    assert all(s.parent_span_id in by_id for s in mine if s.parent_span_id)  # no orphan in the trace
