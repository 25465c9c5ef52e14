"""One tracing span per handled record (``streams/telemetry/tracing.py``), installed only with tracing on
(``Runtime.tracing``).

The span is named ``"{service} {EventType}"`` (the service is its consumer group), is a child of the
record's ``traceparent`` header, and lasts over every attempt; the events the handler emits carry its
context (``Delivery.out_traceparent``, read by ``Publish``). A run its root decided not to sample gets
no span, but its trace still propagates. A record that failed for good ends its span with an error
status (``Delivery.failure``); one tried more than once says how often. A forwarded record has no span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentstream.streams.runtime.middleware.chain import Delivery, Next
from agentstream.streams.telemetry import trace_context

if TYPE_CHECKING:  # OpenTelemetry is the [worker] extra
    from agentstream.streams.telemetry.tracing import Tracing


class RecordTracing:
    def __init__(self, tracing: Tracing, service: str) -> None:
        self.tracing = tracing
        self.service = service

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        if delivery.misrouted:
            await call_next(delivery)
            return
        record, event = delivery.record, delivery.event
        parent = trace_context.valid(record.headers.get(trace_context.HEADER))
        span, delivery.out_traceparent = self.tracing.start_record_span(self.service, delivery.event_type, parent, {
            "agentstream.run_id": event.run_id, "agentstream.step_id": event.step_id,
            "agentstream.queue_wait_ms": delivery.queue_wait * 1000, "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": record.partition, "messaging.kafka.offset": record.offset})
        delivery.span = span
        try:
            await call_next(delivery)
        finally:
            if span is not None:
                if delivery.failure is not None:
                    self.tracing.fail(span, delivery.failure)
                if delivery.attempt > 1 or event.attempt:
                    span.set_attributes({"agentstream.attempts": delivery.attempt,
                                         "agentstream.attempt": event.attempt})
                span.end()


__all__ = ["RecordTracing"]
