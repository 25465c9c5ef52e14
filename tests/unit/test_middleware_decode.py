"""Decoding and the topic's contract (streams/runtime/middleware/decode.py): an undecodable record is
dead-lettered with the decoder's kind, a schema lookup that meets an outage waits with the partition
held, and an event the topic does not carry is refused."""

from __future__ import annotations

from agentstream.streams.core.events import InferenceCompleted, ToolCallCompleted
from agentstream.streams.runtime.failures import PartitionHolds
from agentstream.streams.runtime.middleware.chain import compose
from agentstream.streams.runtime.middleware.decode import Decode, Refuse
from agentstream.streams.runtime.records import RetryPolicy, ServiceConfig

from .middleware_kit import End, Letters, delivery, runtime, stats, task

CONFIG = ServiceConfig(name="svc", topics=["t.in"], group_id="g", retry=RetryPolicy(backoff_s=0.001),
                       outage_backoff_s=0.001)


async def test_a_record_decodes_to_its_event():
    rt, end, letters = await runtime(), End(), Letters()
    event = task()
    d = delivery(event, decoded=False)
    await compose([Decode("svc", rt, PartitionHolds(CONFIG, {}), letters, stats())], end)(d)  # type: ignore[arg-type]
    assert end.calls == [d] and d.event == event and letters.sent == []


async def test_an_undecodable_record_is_dead_lettered():
    rt, end, letters = await runtime(), End(), Letters()
    d = delivery(value=b"\x01not avro", decoded=False, key=b"g")
    await compose([Decode("svc", rt, PartitionHolds(CONFIG, {}), letters, stats())], end)(d)  # type: ignore[arg-type]
    [(offset, kind, reason, run_id)] = letters.sent
    assert (offset, kind, run_id) == (7, "undecodable", None) and "magic byte" in reason and end.calls == []


async def test_a_schema_lookup_waits_out_an_outage_with_its_partition_held():
    rt, end, counts = await runtime(), End(), stats()
    holds = PartitionHolds(CONFIG, {})
    real = rt.codec.decode_async
    tries = []

    async def flaky(value, *, raise_outages=False):
        tries.append(dict(holds.held))
        if len(tries) < 3:
            raise ConnectionRefusedError("broker away")
        return await real(value, raise_outages=raise_outages)

    rt.codec.decode_async = flaky  # type: ignore[method-assign]
    try:
        d = delivery(decoded=False)
        await compose([Decode("svc", rt, holds, Letters(), counts)], end)(d)  # type: ignore[arg-type]
    finally:
        del rt.codec.decode_async
    assert tries == [{}, {d.tp: 1}, {d.tp: 1}] and holds.held == {} and not holds.outages
    assert counts["outage_retries"] == 2 and end.calls == [d]


async def test_an_event_its_topic_does_not_carry_is_refused():
    rt, end, letters = await runtime(), End(), Letters()
    refuse = Refuse("svc", rt.topics, letters)  # type: ignore[arg-type]
    reply = InferenceCompleted.build(run_id="r", step="r:0:model", service="mallory", text="{}",
                                     finish_reason="stop")
    await compose([refuse], end)(delivery(reply, topic=rt.topics.tool_results))
    [(_, kind, reason, run_id)] = letters.sent
    assert (kind, run_id) == ("refused", "r") and reason.startswith("InferenceCompleted is not an event of")
    result = ToolCallCompleted.build(run_id="r", step="r:1:tool", service="tools", tool="t", ok=True, result="2")
    await compose([refuse], end)(delivery(result, topic=rt.topics.tool_results))
    assert len(end.calls) == 1 and len(letters.sent) == 1
