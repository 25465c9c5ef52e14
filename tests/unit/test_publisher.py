"""The producer side (streams/runtime/publisher.py): what every sent event carries, and the header
hooks through which the producer of an event type adds headers its consumers read — the transport
itself special-cases no event type. The planner registers the prompt-token estimate that the inference
backlog sampler reads (streams/telemetry/backlog.py), byte for byte as it always was."""

from __future__ import annotations

from agentstream.streams.core.events import InferenceRequested, Message
from agentstream.streams.runtime.headers import TYPE_HEADER
from agentstream.streams.telemetry import trace_context
from agentstream.streams.telemetry.backlog import (
    PROMPT_TOKENS_HEADER,
    estimate_prompt_tokens,
    prompt_tokens_header,
)

from .fakes import FakeKafka
from .middleware_kit import runtime, task
from .planner_fakes import MemoryHistory, PlannerRig, settings

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def model_request() -> InferenceRequested:
    return InferenceRequested.build(run_id="r", step="r:0:model", service="planner",
                                    messages=[Message(role="system", content="x" * 400),
                                              Message(role="user", content="y" * 40)])


async def test_an_event_carries_its_type_and_the_trace_it_was_sent_in():
    kafka = FakeKafka()
    rt = await runtime(kafka)
    token = trace_context.CURRENT.set(TP)
    try:
        await (await rt.send("t.out", task("r:0")))
    finally:
        trace_context.CURRENT.reset(token)
    [sent] = kafka.produced
    assert sent.key == b"r" and sent.headers == [(TYPE_HEADER, b"TaskSubmitted"), (trace_context.HEADER, TP.encode())]


async def test_without_a_hook_no_event_type_gets_headers_of_its_own():
    kafka = FakeKafka()
    rt = await runtime(kafka)
    await (await rt.send("t.out", model_request(), headers=[(trace_context.HEADER, TP.encode())]))
    assert [k for k, _ in kafka.produced[0].headers] == [TYPE_HEADER, trace_context.HEADER]


async def test_a_hook_adds_its_headers_to_its_event_type_only():
    kafka = FakeKafka()
    rt = await runtime(kafka)
    rt.add_header_hook(InferenceRequested, prompt_tokens_header)
    request = model_request()
    await (await rt.send("t.out", request, headers=[(trace_context.HEADER, TP.encode())]))
    await (await rt.send("t.out", task("r:1")))
    with_hook, other = kafka.produced
    assert with_hook.headers == [(TYPE_HEADER, b"InferenceRequested"), (trace_context.HEADER, TP.encode()),
                                 (PROMPT_TOKENS_HEADER, b"%d" % estimate_prompt_tokens(request))]
    assert dict(with_hook.headers)[PROMPT_TOKENS_HEADER] == b"118"
    assert PROMPT_TOKENS_HEADER not in dict(other.headers)


async def test_the_planners_model_requests_carry_their_prompt_tokens():
    kafka = FakeKafka()
    rig = PlannerRig(kafka, MemoryHistory(), settings())
    await rig.take(0)
    await rig.feed(task("r:task"))
    [request] = [p for p in kafka.produced if dict(p.headers)[TYPE_HEADER] == b"InferenceRequested"]
    event = rig.runtime.codec.decode(request.value)
    assert isinstance(event, InferenceRequested)
    assert dict(request.headers)[PROMPT_TOKENS_HEADER] == b"%d" % estimate_prompt_tokens(event)
