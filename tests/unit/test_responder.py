"""The replay responder (services/replay/responder.py) on an in-memory broker (agentstream.testing).

What is proved here, with no Kafka and no PostgreSQL: a replayed run's requests are answered with what
the original run's step of the same index and kind returned (the step ids differ: they contain the run
id), as replayed results; a tool call or search that differs from the record, a step the original
never had, and a run nobody is replaying get an error result that says so, never the recorded result;
a fork hands the steps from ``live_from`` on to the live handlers and answers the earlier ones from the
record.
"""

from __future__ import annotations

import json

import pytest

from agentstream.services.replay.responder import (
    NO_RECORD,
    LiveHandlers,
    RecordedStep,
    Recording,
    Responder,
    parse_step,
)
from agentstream.streams.core.events import (
    Event,
    InferenceCompleted,
    InferenceRequested,
    Message,
    RetrievalCompleted,
    RetrievalRequested,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.ids import step_id
from agentstream.testing import InMemoryBroker

ORIGINAL = "run-original"
REPLAY = "run-replay"

RECORDING = Recording(ORIGINAL, {
    (0, "model"): RecordedStep(0, "model", "done", {"messages": []},
                               {"text": '{"tool": "calculator"}', "finish_reason": "stop", "prompt_tokens": 11,
                                "completion_tokens": 7, "model": "m"}, None),
    (1, "tool"): RecordedStep(1, "tool", "done", {"tool": "calculator", "arguments": {"expression": "2+2"}},
                              {"ok": True, "result": "4"}, None, attempts=2),
    (2, "retrieval"): RecordedStep(2, "retrieval", "done", {"query": "kafka"},
                                   {"passages": [{"id": "d1", "text": "Kafka is a log", "score": 0.9}]}, None),
    (3, "tool"): RecordedStep(3, "tool", "failed", {"tool": "http_get", "arguments": {"url": "http://x"}},
                              {"ok": False}, "timed out", error_kind="timeout"),
})


def model(run_id: str, index: int) -> InferenceRequested:
    return InferenceRequested.build(run_id=run_id, step=step_id(run_id, index, "model"), service="planner",
                                    messages=[Message(role="user", content="2+2?")])


def tool_call(run_id: str, index: int, tool: str, arguments: dict) -> ToolCallRequested:
    return ToolCallRequested.build(run_id=run_id, step=step_id(run_id, index, "tool"), service="planner",
                                   tool=tool, arguments=json.dumps(arguments, sort_keys=True))


def search(run_id: str, index: int, query: str) -> RetrievalRequested:
    return RetrievalRequested.build(run_id=run_id, step=step_id(run_id, index, "retrieval"), service="planner",
                                    query=query)


@pytest.fixture
async def broker():
    async with InMemoryBroker() as broker:
        yield broker


@pytest.fixture
def responder(broker) -> Responder:
    responder = Responder(broker.runtime)
    responder.expect(REPLAY, RECORDING)
    return responder


async def test_each_request_is_answered_from_the_original_step_of_the_same_index_and_kind(broker, responder):
    reply = (await broker.deliver(responder.handle, model(REPLAY, 0))).one(InferenceCompleted)
    assert (reply.run_id, reply.step_id) == (REPLAY, step_id(REPLAY, 0, "model"))
    assert (reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens, reply.error) == \
        ('{"tool": "calculator"}', "stop", 11, 7, None)
    handled = await broker.deliver(responder.handle, tool_call(REPLAY, 1, "calculator", {"expression": "2+2"}))
    result = handled.one(ToolCallCompleted)
    assert (result.ok, result.result, result.replayed, result.attempts, result.error) == (True, "4", True, 2, None)
    assert handled.sent[0][0] == broker.topics.tool_results
    found = (await broker.deliver(responder.handle, search(REPLAY, 2, "kafka"))).one(RetrievalCompleted)
    assert [(p.id, p.text, p.score) for p in found.passages] == [("d1", "Kafka is a log", 0.9)]
    failed = (await broker.deliver(responder.handle, tool_call(REPLAY, 3, "http_get", {"url": "http://x"}))
              ).one(ToolCallCompleted)
    assert (failed.ok, failed.error, failed.error_kind) == (False, "timed out", "timeout")  # recorded, as it was
    assert responder.stats == {"recorded": 4, "live": 0, "unmatched": 0}


@pytest.mark.parametrize("request_, problem", [
    (tool_call(REPLAY, 1, "calculator", {"expression": "2+3"}), "the original called calculator"),
    (tool_call(REPLAY, 1, "http_get", {"expression": "2+2"}), "the original called calculator"),
    (tool_call(REPLAY, 7, "calculator", {"expression": "2+2"}), "has no recorded tool step 7"),
    (tool_call("run-elsewhere", 1, "calculator", {"expression": "2+2"}), "is not being replayed"),
])
async def test_a_tool_call_that_differs_from_the_record_gets_an_error_not_the_recorded_result(
        broker, responder, request_, problem):
    result = (await broker.deliver(responder.handle, request_)).one(ToolCallCompleted)
    assert not result.ok and result.result is None and problem in (result.error or ""), result.error
    assert result.error_kind == NO_RECORD and result.replayed
    assert responder.stats["unmatched"] == 1


async def test_a_search_or_model_step_without_a_match_says_so(broker, responder):
    other = (await broker.deliver(responder.handle, search(REPLAY, 2, "postgres"))).one(RetrievalCompleted)
    assert other.passages == [] and "the original searched 'kafka'" in (other.error or "")
    missing = (await broker.deliver(responder.handle, model(REPLAY, 5))).one(InferenceCompleted)
    assert missing.finish_reason == "error" and "no recorded model step 5" in (missing.error or "")


class Live:
    def __init__(self) -> None:
        self.handled: list[str] = []

    async def handle(self, event: Event, ctx) -> None:
        self.handled.append(event.step_id)


async def test_a_fork_hands_steps_from_live_from_on_to_the_live_handlers(broker):
    live = Live()
    responder = Responder(broker.runtime, LiveHandlers(inference=live, tools=live))
    responder.expect(REPLAY, RECORDING, live_from=1)
    assert (await broker.deliver(responder.handle, model(REPLAY, 0))).one(InferenceCompleted).error is None
    handled = await broker.deliver(responder.handle, tool_call(REPLAY, 1, "calculator", {"expression": "9"}))
    assert handled.sent == [] and live.handled == [step_id(REPLAY, 1, "tool")]  # live: no recorded answer
    no_live = (await broker.deliver(responder.handle, search(REPLAY, 2, "kafka"))).one(RetrievalCompleted)
    assert no_live.error is None  # no live retrieval handler: the record answers
    assert responder.stats == {"recorded": 2, "live": 1, "unmatched": 0}


async def test_a_fork_needs_live_handlers_and_only_requests_are_handled(broker, responder):
    with pytest.raises(ValueError, match="live handlers"):
        Responder(broker.runtime).expect(REPLAY, RECORDING, live_from=1)
    with pytest.raises(TypeError, match="does not handle"):
        await broker.deliver(responder.handle, (await broker.deliver(responder.handle, model(REPLAY, 0))
                                                ).one(InferenceCompleted))


def test_step_ids_are_read_as_index_and_kind():
    assert parse_step("run-a", "run-a:3:tool") == (3, "tool")
    assert parse_step("run-a", "run-a:prefetch") == (-1, "prefetch")
    assert parse_step("run-a", "run-a:3:tool/retrieve") == (3, "tool/retrieve")
    assert parse_step("run-a", "run-a:x:tool") == (-2, "x:tool")
