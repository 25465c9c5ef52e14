"""The innermost steps (streams/runtime/middleware/publish.py): each attempt gets a fresh ``Context``
whose trace the task's sends join, and the record is done only once what the handler emitted is
acknowledged; the handler gets the event."""

from __future__ import annotations

import asyncio

from agentstream.streams.core.events import Event
from agentstream.streams.runtime.headers import SOURCE_HEADER
from agentstream.streams.runtime.middleware.chain import Delivery, compose
from agentstream.streams.runtime.middleware.publish import CallHandler, Publish
from agentstream.streams.runtime.records import Context
from agentstream.streams.telemetry import trace_context

from .fakes import FakeKafka
from .middleware_kit import delivery, runtime, task

OUT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_the_record_is_done_once_its_outputs_are_acknowledged():
    kafka = FakeKafka()
    kafka.hold_acks = True
    rt = await runtime(kafka)
    seen: list[tuple[Event, Context]] = []

    async def handler(event: Event, ctx: Context) -> None:
        seen.append((event, ctx))
        assert trace_context.CURRENT.get() == OUT
        await ctx.emit("t.out", task("r:1"))

    d = delivery(task("r:0"))
    d.out_traceparent = OUT
    trip = asyncio.create_task(compose([Publish("svc", rt)], CallHandler(rt, handler))(d))
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(seen) == 1 and not trip.done()  # handled, not acknowledged yet
    kafka.ack_all()
    await trip
    [(event, ctx)] = seen
    assert event == d.event and ctx is d.ctx and ctx.out_traceparent == OUT and ctx.service == "svc"
    [out] = kafka.produced
    assert dict(out.headers)[trace_context.HEADER] == OUT.encode()
    assert dict(out.headers)[SOURCE_HEADER].decode().startswith("t.in:0:7:")


async def test_each_attempt_gets_a_fresh_context():
    rt = await runtime()
    contexts: list[Context] = []

    async def handler(event: Event, ctx: Context) -> None:
        contexts.append(ctx)

    chain = compose([Publish("svc", rt)], CallHandler(rt, handler))
    d: Delivery = delivery()
    await chain(d)
    await chain(d)
    assert len(contexts) == 2 and contexts[0] is not contexts[1]
