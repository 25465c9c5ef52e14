"""De-duplication (streams/runtime/middleware/dedup.py): an id handled recently is dropped and counted;
an id is remembered only once its record is done, not when the handler asked to forget it, and not for
a record forwarded elsewhere."""

from __future__ import annotations

from agentstream.streams.runtime.middleware.chain import Delivery, Next, compose
from agentstream.streams.runtime.middleware.dedup import Dedup, SeenEvents

from .middleware_kit import End, delivery, stats, task


def test_the_newest_ids_are_kept():
    seen = SeenEvents(2)
    for event_id in ("a", "b", "c"):
        seen.add(event_id)
    assert "a" not in seen and "b" in seen and "c" in seen


def _done(**flags: bool):
    async def step(d: Delivery, call_next: Next) -> None:
        await call_next(d)
        d.done = flags.get("done", True)
        d.misrouted = flags.get("misrouted", False)
        if flags.get("forget") and d.ctx is None:
            from agentstream.streams.runtime.records import Context

            d.ctx = Context(None, "svc", d.record)  # type: ignore[arg-type]
            d.ctx.forget()
    return step


async def test_a_done_record_is_remembered_and_its_copy_dropped():
    seen, counts, end = SeenEvents(10), stats(), End()
    chain = compose([Dedup(seen, counts), _done()], end)
    event = task("r:0")
    await chain(delivery(event))
    copy = delivery(event, offset=8)
    await chain(copy)
    assert event.event_id in seen and len(end.calls) == 1
    assert copy.duplicate and counts["duplicates"] == 1


async def test_not_done_forgotten_or_forwarded_is_not_remembered():
    for flags in ({"done": False}, {"forget": True}, {"misrouted": True}):
        seen, end = SeenEvents(10), End()
        chain = compose([Dedup(seen, stats()), _done(**flags)], end)
        await chain(delivery())
        await chain(delivery())
        assert len(end.calls) == 2, flags
