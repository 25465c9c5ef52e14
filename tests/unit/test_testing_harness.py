"""The harness users import (agentstream.testing): its public names, ``ToolEnvironment``, the in-memory
broker, and the README's "Unit-testing your tools" example, run as written."""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

import agentstream.testing
from agentstream.services.tools.registry import ToolContext, tool
from agentstream.streams.core.errors import ToolArgumentError, ToolError
from agentstream.streams.core.events import Event, Passage, TaskSubmitted, ToolCallCompleted
from agentstream.testing import InMemoryBroker, ToolEnvironment

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_public_names_are_pinned():
    assert sorted(agentstream.testing.__all__) == [
        "Handled", "InMemoryBroker", "InMemoryDatabase", "Pipeline", "ToolEnvironment", "ToolHarness",
        "end_offsets", "isolated", "read_events", "wait_awaiting_approval"]
    assert all(hasattr(agentstream.testing, name) for name in agentstream.testing.__all__)


async def test_the_readme_example_runs_as_written():
    text = README.read_text()
    section = text[text.index("## Unit-testing your tools"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the section has no python example"
    module = types.ModuleType("readme_example")
    exec(compile(code.group(1), "README.md", "exec"), module.__dict__)
    tests = [value for name, value in vars(module).items() if name.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        await test()


# -- ToolEnvironment ------------------------------------------------------------------------------

@tool(timeout_s=0.05)
async def echo(text: str, ctx: ToolContext, times: int = 1) -> dict:
    return {"text": text * times, "run": ctx.run_id, "step": ctx.step_id, "attempt": ctx.attempt,
            "pool": ctx.pool, "pair": (1, 2)}


@tool(timeout_s=0.05)
async def slow() -> str:
    await asyncio.sleep(1)
    return "late"


@tool
async def opaque() -> object:
    return object()


@tool
async def picky(n: int) -> int:
    if n < 0:
        raise ToolError("n must not be negative", retriable=False)
    return n


@tool
async def searching(query: str, ctx: ToolContext) -> list[str]:
    assert ctx.retrieve is not None
    found = await ctx.retrieve(query, 2, "docs", 5.0)
    return [p.text for p in found.passages]


async def test_a_tool_runs_with_its_context_and_its_result_comes_back_through_json():
    env = ToolEnvironment(run_id="run-7", attempt=2, pool="the pool")
    result = await env.run(echo, {"text": "ab"}, times=2)
    assert result == {"text": "abab", "run": "run-7", "step": "run-7:0:tool", "attempt": 2, "pool": "the pool",
                      "pair": [1, 2]}


async def test_what_the_run_would_hear_as_an_error_is_raised():
    env = ToolEnvironment()
    with pytest.raises(ToolArgumentError, match="missing required argument"):
        await env.run(echo)
    with pytest.raises(ToolArgumentError, match="must be of type integer"):
        await env.run(echo, text="a", times="2")
    with pytest.raises(TimeoutError):
        await env.run(slow)
    with pytest.raises(TypeError):
        await env.run(opaque)  # the service reports a result JSON cannot encode as the step's error
    error = await env.error(picky, n=-1)
    assert str(error) == "n must not be negative" and not error.retriable
    with pytest.raises(AssertionError, match="returned 3"):
        await env.error(picky, n=3)


async def test_a_tools_search_is_answered_and_recorded():
    def search(query: str, k: int, collection: str) -> list[Passage]:
        return [Passage(id=str(i), text=f"{query} {i}", score=1.0) for i in range(k)]

    env = ToolEnvironment(search=search)
    assert await env.run(searching, query="kafka") == ["kafka 0", "kafka 1"]
    assert env.searches == [("kafka", 2, "docs")]
    assert ToolEnvironment().context().retrieve is None  # no search: as on a worker without retrieval


# -- InMemoryBroker -------------------------------------------------------------------------------

def task(run_id: str) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="test", task="t", max_steps=1)


async def test_records_go_to_the_partition_kafka_would_choose_and_decode_back():
    async with InMemoryBroker() as broker:
        topic = broker.topics.tasks
        for i in range(10):
            record = broker.publish(topic, task(f"run-{i}"))
            assert record.partition == broker.topics.partition_for(f"run-{i}") and record.key == f"run-{i}".encode()
        assert [e.run_id for e in broker.events(topic, TaskSubmitted)] == [f"run-{i}" for i in range(10)]
        assert broker.partitions(broker.topics.dlq) == 1


async def echo_handler(event: Event, ctx) -> None:
    await ctx.emit(ctx.topics.tool_results, ToolCallCompleted.build(
        run_id=event.run_id, step=event.step_id, service="test", tool="t", ok=True, result="1"))


async def test_deliver_hands_an_event_to_a_handler_and_returns_what_it_published():
    async with InMemoryBroker() as broker:
        handled = await broker.deliver(echo_handler, task("run-1"))
        assert handled.record.topic == broker.topics.tasks and handled.record.offset == 0 and handled.remembered
        (topic, result), = handled.sent
        assert topic == broker.topics.tool_results and handled.one(ToolCallCompleted) is result
        (stored,) = broker.records(broker.topics.tool_results)
        assert dict(stored.headers)["agentstream-source"].startswith(f"{broker.topics.tasks}:".encode())
        with pytest.raises(AssertionError, match="expected one TaskSubmitted, the handler published "
                                                 "ToolCallCompleted on"):
            handled.one(TaskSubmitted)


async def test_a_record_is_done_only_once_what_it_published_is_acknowledged():
    async with InMemoryBroker() as broker:
        broker.hold_acks = True
        delivering = asyncio.create_task(broker.deliver(echo_handler, task("run-1")))
        await asyncio.sleep(0.01)
        assert not delivering.done() and len(broker.records(broker.topics.tool_results)) == 1
        broker.ack_all()
        assert (await delivering).one(ToolCallCompleted).ok
        broker.hold_acks, broker.send_error = False, KafkaTimeoutError()
        with pytest.raises(KafkaTimeoutError):  # what the handler raises comes out of deliver
            await broker.deliver(echo_handler, task("run-2"))


async def test_a_consumer_reads_from_its_position_and_waits_for_records():
    async with InMemoryBroker() as broker:
        topic = broker.topics.outcomes
        tp = TopicPartition(topic, 0)
        broker.append(topic, b"old", partition=0)
        consumer = broker.consumer()
        consumer.assign([tp])
        assert (await consumer.end_offsets([tp]))[tp] == 1 and await consumer.position(tp) == 1  # latest
        assert await consumer.getmany(timeout_ms=1) == {}
        later = asyncio.get_running_loop().call_later(0.01, lambda: broker.append(topic, b"new", partition=0))
        batch = await consumer.getmany(timeout_ms=1000)
        later.cancel()
        assert [r.value for r in batch[tp]] == [b"new"]
        consumer.seek(tp, 0)
        assert [r.value for r in (await consumer.getmany(tp, max_records=1))[tp]] == [b"old"]
