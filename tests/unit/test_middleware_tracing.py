"""The tracing middleware (streams/runtime/middleware/tracing.py): one span per handled record, child of
its ``traceparent``, over every attempt; an error status when it failed for good; none for a record
forwarded to its run's partition."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentstream.streams.runtime.middleware.chain import Delivery, Next, compose
from agentstream.streams.runtime.middleware.tracing import RecordTracing
from agentstream.streams.telemetry import trace_context
from agentstream.streams.telemetry.tracing import Tracing

from .middleware_kit import End, delivery, task

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans():
    memory = InMemorySpanExporter()
    tracing = Tracing(memory, batch=False)
    yield tracing, memory
    tracing.shutdown()


async def test_a_record_is_one_span_child_of_its_header(spans):
    tracing, memory = spans
    d = delivery(task("r:0"), headers={trace_context.HEADER: TP.encode()})
    await compose([RecordTracing(tracing, "svc")], End())(d)
    [span] = memory.get_finished_spans()
    assert span.name == "svc TaskSubmitted" and span.kind.name == "CONSUMER"
    assert span.parent.span_id == int(TP[36:52], 16) and span.context.trace_id == int(TP[3:35], 16)
    assert d.out_traceparent == f"00-{TP[3:35]}-{span.context.span_id:016x}-01"
    assert span.attributes["agentstream.run_id"] == "r" and span.attributes["messaging.kafka.offset"] == 7
    assert span.attributes["agentstream.queue_wait_ms"] == pytest.approx(5.0)
    assert "agentstream.attempts" not in span.attributes and span.status.status_code.name == "UNSET"


async def test_a_record_that_failed_for_good_says_why_and_how_often(spans):
    tracing, memory = spans

    async def failed(d: Delivery, call_next: Next) -> None:  # what Recover leaves behind
        await call_next(d)
        d.attempt, d.failure = 3, "retries_exhausted: Unavailable: busy"

    await compose([RecordTracing(tracing, "svc"), failed], End())(delivery(task("r:0", attempt=1)))
    [span] = memory.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "retries_exhausted: Unavailable: busy"
    assert (span.attributes["agentstream.attempts"], span.attributes["agentstream.attempt"]) == (3, 1)


async def test_the_span_ends_when_the_record_is_put_aside(spans):
    tracing, memory = spans
    with pytest.raises(LookupError):
        await compose([RecordTracing(tracing, "svc")], End(lambda _n: LookupError()))(delivery())
    assert len(memory.get_finished_spans()) == 1


async def test_a_forwarded_record_has_no_span(spans):
    tracing, memory = spans
    d = delivery()
    d.misrouted = True
    end = End()
    await compose([RecordTracing(tracing, "svc")], end)(d)
    assert end.calls == [d] and d.span is None and memory.get_finished_spans() == ()


@pytest.mark.parametrize("header, kept", [
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", False),    # short
    (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", False),   # upper case
    (b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),   # the invalid all-zero trace id
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),   # the invalid all-zero parent id
    (b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),   # the invalid version
    (b"x" * 100_000, False), (b"\xff" * 55, False), (b"", False), (None, False),
])
def test_only_a_w3c_traceparent_header_is_taken(header: bytes | None, kept: bool) -> None:
    """A producer's header is input: junk (the hostile suite sent 100,000 characters) is dropped, not stored."""
    assert trace_context.valid(header) == (header.decode() if kept and header else None)
