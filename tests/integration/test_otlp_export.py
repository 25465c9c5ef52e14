"""OTLP export to a real HTTP endpoint: a run's spans, from every service, arrive as OTLP/protobuf
requests (what an OpenTelemetry collector receives) and form one trace. The exporter is the ``otlp``
extra, which ``dev`` includes."""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.telemetry import tracing as telemetry_tracing
from agentstream.streams.telemetry.tracing import Tracing
from agentstream.testing import Pipeline, isolated


async def _collector() -> tuple[web.AppRunner, str, list[tuple[str, bytes]]]:
    """A stand-in for a collector's OTLP/HTTP receiver: it keeps each request's content type and body."""
    received: list[tuple[str, bytes]] = []

    async def traces(request: web.Request) -> web.Response:
        received.append((request.content_type, await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1/traces", received


async def test_a_runs_spans_reach_an_otlp_endpoint_as_one_trace(settings):
    runner, endpoint, received = await _collector()
    tracing = Tracing.from_settings(TelemetrySettings(tracing="otlp", otlp_endpoint=endpoint))
    assert tracing is not None
    telemetry_tracing.install(tracing)  # the client's root span too
    try:
        async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."),
                                  WorkerOptions(backend="scripted", tracing=tracing)) as pipe:
            run_id = await pipe.client.submit("What is 17 * 23?", tools=["calculator"], max_steps=5,
                                              prefetch=False)
            assert (await pipe.client.wait(run_id, timeout=30)).ok
        # The exporter posts from its own threads with blocking HTTP; this loop must keep serving them.
        await asyncio.to_thread(tracing.shutdown)
    finally:
        telemetry_tracing.install(None)
        await runner.cleanup()

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
