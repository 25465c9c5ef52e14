"""The chain the consumer loop calls per record (streams/runtime/middleware/chain.py): the first
middleware is the outermost, one that does not call the rest stops the record there, the delivery
answers for its event only once it is decoded, and a runner installs the optional middlewares (stage
timing, metrics, tracing, routing) only when its runtime and config ask for them."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentstream.streams.core.events import ClaimCheck, Event, InferenceCompleted
from agentstream.streams.runtime.middleware.chain import Delivery, Next, compose
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner
from agentstream.streams.telemetry.metrics import Metrics
from agentstream.streams.telemetry.stages import StageClock
from agentstream.streams.telemetry.tracing import Tracing

from .middleware_kit import End, delivery, runtime, task


class Note:
    def __init__(self, name: str, log: list[str], *, stop: bool = False) -> None:
        self.name, self.log, self.stop = name, log, stop

    async def __call__(self, d: Delivery, call_next: Next) -> None:
        self.log.append(f"> {self.name}")
        if not self.stop:
            await call_next(d)
        self.log.append(f"< {self.name}")


async def test_the_first_middleware_is_the_outermost():
    log: list[str] = []
    end = End()
    chain = compose([Note("a", log), Note("b", log)], end)
    d = delivery()
    await chain(d)
    assert log == ["> a", "> b", "< b", "< a"] and end.calls == [d]


async def test_a_middleware_that_does_not_call_the_rest_ends_the_trip():
    log: list[str] = []
    end = End()
    await compose([Note("a", log, stop=True), Note("b", log)], end)(delivery())
    assert log == ["> a", "< a"] and end.calls == []


async def test_no_middlewares_is_the_endpoint_alone():
    end = End()
    await compose([], end)(delivery())
    assert len(end.calls) == 1


def test_the_event_is_there_only_once_decoded():
    d = delivery(decoded=False)
    with pytest.raises(RuntimeError, match="after Decode"):
        _ = d.event
    d.decoded = task()
    assert d.event_type == "TaskSubmitted" and d.remembered


def test_a_claim_check_is_labelled_with_the_type_it_stands_for():
    check = ClaimCheck.build(run_id="r", step="r:0:model", service="s", event_type=InferenceCompleted.schema_name,
                             digest="0" * 64, size=1)
    assert delivery(check).event_type == "InferenceCompleted"


def _installed(runner: ServiceRunner) -> list[str]:
    """The middlewares of a runner's chain, outermost first (``compose`` nests partials)."""
    names, call = [], runner._chain
    while isinstance(call, functools.partial):
        names.append(type(call.func).__name__)
        call = call.keywords["call_next"]
    return [*names, type(call).__name__]


async def test_a_runner_installs_only_what_its_runtime_has(tmp_path):
    async def handler(event: Event, ctx: Context) -> None: ...

    config = ServiceConfig(name="svc", topics=["t.in"], group_id="g")
    bare = ServiceRunner(await runtime(), config, handler)
    assert _installed(bare) == ["Decode", "Refuse", "Dedup", "Recover", "Publish", "CallHandler"]
    tracing = Tracing(InMemorySpanExporter(), batch=False)
    full = ServiceRunner(await runtime(tracing=tracing, metrics=Metrics(process=False), stages=StageClock(tmp_path)),
                         replace(config, route_by_run=True), handler)
    assert _installed(full) == ["_RecordStages", "RecordMetrics", "Decode", "_DecodeStage", "Refuse", "Dedup",
                                "RouteByRun", "RecordTracing", "Recover", "AttemptMetrics", "Forward", "_AckStage",
                                "Publish", "_HandleStage", "CallHandler"]
    tracing.shutdown()
