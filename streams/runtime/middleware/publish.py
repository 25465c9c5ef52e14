"""The innermost steps of an attempt: ``Publish`` gives it a fresh ``Context`` and holds the record until
everything the handler emitted is acknowledged by the broker (``acks=all``): only then is the record
done and may its offset be committed. ``CallHandler`` ends the chain: the service's handler, with the
event a claim check stands for redeemed first (``Runtime.redeem``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentstream.streams.core.events import ClaimCheck
from agentstream.streams.runtime.middleware.chain import Delivery, Next
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, Handler
from agentstream.streams.telemetry import trace_context

if TYPE_CHECKING:  # prometheus-client is the [worker] extra
    from agentstream.streams.telemetry.metrics import ServiceMetrics


class Publish:
    def __init__(self, service: str, runtime: Runtime, metrics: ServiceMetrics | None = None) -> None:
        self.service = service
        self.runtime = runtime
        self.metrics = metrics

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        ctx = delivery.ctx = Context(self.runtime, self.service, delivery.record,
                                     out_traceparent=delivery.out_traceparent, span=delivery.span,
                                     metrics=self.metrics)
        trace_context.CURRENT.set(ctx.out_traceparent)  # this task's: sends without a header join the trace
        await call_next(delivery)
        await ctx.flush()


class CallHandler:
    def __init__(self, runtime: Runtime, handler: Handler) -> None:
        self.runtime = runtime
        self.handler = handler

    async def __call__(self, delivery: Delivery) -> None:
        event, ctx = delivery.event, delivery.ctx
        assert ctx is not None, "CallHandler runs inside Publish"
        await self.handler(await self.runtime.redeem(event) if isinstance(event, ClaimCheck) else event, ctx)


__all__ = ["CallHandler", "Publish"]
