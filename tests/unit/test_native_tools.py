"""Native tool calling (streams/core/tool_calling.py): structured calls on the messages and in the events,
the planner's native mode, and each backend's own form of the tools — the OpenAI-compatible request and
stream, llama.cpp's refusal without a template that renders tools, TensorRT-LLM's chat template and the
calls read back from its text — all without an engine."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from agentstream.services.inference.backends import tool_call_text
from agentstream.services.inference.backends.base import ChatMessage, Final, GenerationRequest
from agentstream.services.inference.backends.chat_stream import ChatStream
from agentstream.services.inference.backends.openai_compat import OpenAIBackend
from agentstream.services.inference.backends.scripted import ScriptedBackend
from agentstream.services.inference.scripted_server import ScriptedServer, ServerConfig
from agentstream.services.planner import machine
from agentstream.services.planner.state import RunState, ToolRequest
from agentstream.streams.core import tool_calling
from agentstream.streams.core.events import (
    InferenceCompleted,
    InferenceRequested,
    Message,
    TaskSubmitted,
    ToolCall,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.kafka.topics import Topics

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TOPICS = Topics()
CALC = ToolInfo("calculator", "Evaluate arithmetic.",
                {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": CALC.parameters}}]


def _start(**kw: Any) -> RunState:
    task = TaskSubmitted.build(run_id="r", step="r:task", service="client", created_at=NOW, task="What is 2+2?",
                               tools=["calculator"], max_steps=8, prefetch=False, **kw)
    return machine.start(task, [CALC], NOW, max_parallel_calls=4)


def _reply(state: RunState, text: str = "", *calls: ToolCall) -> InferenceCompleted:
    return InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference", text=text,
                                    finish_reason="tool_calls" if calls else "stop", tool_calls=list(calls))


def _call(i: int, expression: str, name: str = "calculator") -> ToolCall:
    return ToolCall(id=f"call_{i}", name=name, arguments=json.dumps({"expression": expression}))


def _model_request(state: RunState) -> InferenceRequested:
    return next(e for _, e in machine.outputs(state, TOPICS) if isinstance(e, InferenceRequested))


# -- the events ---------------------------------------------------------------------------------------

def test_tool_calls_and_their_ids_travel_in_the_events_and_default_to_none():
    codec = Codec(LocalRegistry())
    said = Message(role="assistant", content="", tool_calls=[_call(0, "2+2")])
    answer = Message(role="tool", name="calculator", content="4", tool_call_id="call_0")
    request = InferenceRequested.build(run_id="r", step="r:2:model", service="planner", messages=[said, answer],
                                       tools=json.dumps(TOOLS))
    assert codec.decode(codec.encode(request)) == request
    reply = InferenceCompleted.build(run_id="r", step="r:0:model", service="inference", text="",
                                     finish_reason="tool_calls", tool_calls=[_call(0, "2+2")])
    assert codec.decode(codec.encode(reply)) == reply
    plain = InferenceCompleted.build(run_id="r", step="r:0:model", service="inference", text="4", finish_reason="stop")
    assert codec.decode(codec.encode(plain)).tool_calls == [] and Message(role="user", content="x").tool_call_id is None


def test_a_task_may_choose_native_or_json_and_nothing_else():
    assert tool_calling.problem(None) is None and tool_calling.problem("native") is None
    assert "tool_calling must be one of native, json (got 'xml')" in (tool_calling.problem("xml") or "")


# -- the planner's native mode --------------------------------------------------------------------------

def test_a_native_run_sends_its_tools_in_the_engines_form_and_no_action_schema():
    state = _start(tool_calling="native")
    request = _model_request(state)
    assert json.loads(request.tools or "") == TOOLS and request.response_schema is None
    assert '"action"' not in request.messages[0].content and "plain text" in request.messages[0].content
    json_mode = _model_request(_start())
    assert json_mode.tools is None and json_mode.response_schema is not None  # the default: JSON actions
    assert _model_request(machine.start(
        TaskSubmitted.build(run_id="r", step="r:task", service="client", task="t", tools=["calculator"], max_steps=8,
                            prefetch=False), [CALC], NOW, tool_calling="native")).tools is not None  # planner default


def test_native_calls_keep_their_ids_through_the_fan_out_and_the_answer_is_the_text():
    state = _start(tool_calling="native")
    out = machine.advance(state, _reply(state, "", _call(0, "1+1"), _call(1, "2+2")), NOW)
    assert out.pending_kind == "tools"
    assert out.messages[-1].tool_calls == [_call(0, "1+1"), _call(1, "2+2")]  # the assistant turn keeps them
    requests = [e for _, e in machine.outputs(out, TOPICS) if isinstance(e, ToolCallRequested)]
    assert [json.loads(r.arguments) for r in requests] == [{"expression": "1+1"}, {"expression": "2+2"}]
    for step, value in (("r:2:tool", "4"), ("r:1:tool", "2")):
        out = machine.advance(out, ToolCallCompleted.build(run_id="r", step=step, service="tools", tool="calculator",
                                                           ok=True, result=value), NOW)
    assert [(m.role, m.tool_call_id, m.content) for m in out.messages[-2:]] == [
        ("tool", "call_0", "calculator returned: 2"), ("tool", "call_1", "calculator returned: 4")]
    assert RunState.from_json(out.to_json()) == out  # the calls and ids survive the stored state
    done = machine.advance(out, _reply(out, "2 and 4"), NOW)
    assert (done.status, done.answer) == ("completed", "2 and 4")


def test_a_single_native_call_answers_by_id_and_bad_calls_go_back_to_the_model():
    state = _start(tool_calling="native")
    one = machine.advance(state, _reply(state, "", _call(7, "6*7")), NOW)
    assert one.pending_request == ToolRequest(tool="calculator", arguments={"expression": "6*7"}, call_id="call_7")
    one = machine.advance(one, ToolCallCompleted.build(run_id="r", step="r:1:tool", service="tools", tool="calculator",
                                                       ok=True, result="42"), NOW)
    assert one.messages[-1].tool_call_id == "call_7"

    broken = machine.advance(state, _reply(state, "", ToolCall(id="c", name="calculator", arguments="{oops")), NOW)
    assert broken.parse_failures == 1 and "are not JSON" in broken.messages[-1].content
    assert broken.messages[-2].tool_calls == []  # an unanswered call must not stay in the conversation
    assert "Call a tool, or answer in plain text." in broken.messages[-1].content

    other = machine.advance(state, _reply(state, "", _call(0, "1"), _call(1, "2", name="shell")), NOW)
    assert [(m.role, m.tool_call_id) for m in other.messages[-2:]] == [("tool", "call_0"), ("tool", "call_1")]
    assert "'shell' is not available" in other.messages[-1].content  # every call answered, by its id


def test_an_old_state_keeps_its_message_shape():
    state = _start()
    stored = json.loads(state.to_json())
    assert set(stored["messages"][0]) == {"role", "content", "name"}  # no new keys where nothing is set
    assert "tool_calling" not in stored and "native_tools" not in stored  # at their defaults: not written
    assert RunState.from_json(json.dumps(stored)).tool_calling == "json"


# -- the backends -------------------------------------------------------------------------------------------

def test_streamed_tool_call_fragments_add_up_to_the_calls():
    stream = ChatStream()
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_a", "type": "function", "function": {"name": "calculator", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"expression": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "echo"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"2+2"}'}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    for chunk in chunks:
        assert stream.feed(chunk) == []
    final = stream.final()
    assert stream.begun and final.finish_reason == "tool_calls" and final.text == ""
    assert final.tool_calls == (ToolCall(id="call_a", name="calculator", arguments='{"expression": "2+2"}'),
                                ToolCall(id="call_b", name="echo", arguments="{}"))


def test_the_openai_request_carries_the_tools_and_the_calls_in_their_own_form():
    backend = OpenAIBackend(base_url="http://unused/v1", model="m")
    messages = (ChatMessage(role="user", content="hi"),
                ChatMessage(role="assistant", content="", tool_calls=(_call(0, "2+2"),)),
                ChatMessage(role="tool", name="calculator", content="4", tool_call_id="call_0"),
                ChatMessage(role="tool", name="calculator", content="4"))  # the JSON-action mode's result
    body = backend._body(GenerationRequest(request_id="s", messages=messages, tools=TOOLS,
                                           response_schema={"type": "object"}))
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto" and "response_format" not in body
    assert body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}]}
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_0", "content": "4"}
    assert body["messages"][3] == {"role": "user", "content": "[calculator result] 4"}
    assert "tools" not in backend._body(GenerationRequest(request_id="s", messages=messages[:1]))


async def test_the_scripted_server_answers_a_request_with_tools_with_streamed_calls():
    task = '[[tools:calculator {"expression": "1+1"} | calculator {"expression": "2+2"}]] [[answer:done]]'
    async with TestServer(ScriptedServer(ServerConfig()).app(), host="127.0.0.1") as server:
        backend = OpenAIBackend(base_url=str(server.make_url("/v1")), slots=1, max_retries=0)
        await backend.start()
        try:
            request = GenerationRequest(request_id="s", tools=TOOLS, messages=(ChatMessage(role="user", content=task),))
            final = [item async for item in backend.generate(request)][-1]
            assert isinstance(final, Final) and final.finish_reason == "tool_calls" and final.text == ""
            assert [(c.id, c.name, json.loads(c.arguments)) for c in final.tool_calls] == [
                ("call_0_0", "calculator", {"expression": "1+1"}), ("call_0_1", "calculator", {"expression": "2+2"})]
            answered = (*request.messages, ChatMessage(role="assistant", content="", tool_calls=final.tool_calls),
                        ChatMessage(role="tool", content="2", tool_call_id="call_0_0"),
                        ChatMessage(role="tool", content="4", tool_call_id="call_0_1"))
            last = [item async for item in backend.generate(GenerationRequest(request_id="t", tools=TOOLS,
                                                                               messages=answered))][-1]
            assert isinstance(last, Final) and (last.text, last.tool_calls) == ("done", ())
        finally:
            await backend.close()


async def test_the_in_process_scripted_backend_calls_natively_when_given_tools():
    task = '[[tool:calculator {"expression": "1+1"}]]'
    request = GenerationRequest(request_id="s", tools=TOOLS, messages=(ChatMessage(role="user", content=task),))
    final = [item async for item in ScriptedBackend().generate(request)][-1]
    assert isinstance(final, Final) and final.text == ""
    assert final.tool_calls == (ToolCall(id="call_0_0", name="calculator", arguments='{"expression": "1+1"}'),)


def test_llamacpp_refuses_tools_unless_its_template_can_render_them():
    from agentstream.services.inference.backends.llamacpp import LlamaCppBackend
    from agentstream.streams.core.errors import BackendError

    request = GenerationRequest(request_id="s", tools=TOOLS, messages=(ChatMessage(role="user", content="hi"),))
    with pytest.raises(BackendError, match="tool_calling=json"):
        LlamaCppBackend()._body(request)
    body = LlamaCppBackend(native_tools=True)._body(request)
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto"


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('Let me add.<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>',
     "Let me add.", [("calculator", {"expression": "2+2"})]),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}'
     "</tool_call>", "", [("a", {}), ("b", {"x": 1})]),
    ('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1"}}', "", [("calculator", {"expression": "1"})]),
    ("The answer is 4.", "The answer is 4.", []),
    ('<tool_call>{"nom": "x"}</tool_call>', '<tool_call>{"nom": "x"}</tool_call>', []),
])
def test_calls_are_read_back_from_the_text_of_an_engine_that_gives_text_only(text, content, calls):
    got_content, got = tool_call_text.parse(text)
    assert got_content == content and [(c.name, json.loads(c.arguments)) for c in got] == calls


async def test_trtllm_renders_the_tools_with_the_chat_template_and_reads_the_calls(monkeypatch):
    from agentstream.services.inference.backends.trtllm import TrtLlmBackend
    from tests.unit.trtllm_standin import VERSIONS, Fake

    fake = Fake(VERSIONS[-1])
    monkeypatch.setitem(sys.modules, "tensorrt_llm", fake.package)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", fake.llmapi)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", fake.llm_args)
    fake.engine.script = [('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>', 9,
                           "stop")]
    backend = TrtLlmBackend(model="Qwen/Qwen2.5-0.5B-Instruct")
    await backend.start()
    messages = (ChatMessage(role="user", content="2+2?"),
                ChatMessage(role="assistant", content="", tool_calls=(_call(0, "1+1"),)),
                ChatMessage(role="tool", name="calculator", content="2", tool_call_id="call_0"))
    final = [item async for item in backend.generate(GenerationRequest(request_id="s", tools=TOOLS,
                                                                       messages=messages))][-1]
    assert isinstance(final, Final) and final.text == ""
    assert [(c.name, json.loads(c.arguments)) for c in final.tool_calls] == [("calculator", {"expression": "2+2"})]
    rendered, options = fake.tokenizer.template_calls[-1]
    assert options["tools"] == TOOLS
    assert rendered[1]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "1+1"}}
    assert rendered[2] == {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "2"}
    # guided: once the model opens a call, it must name a tool of the run and match its schema
    tag = json.loads(fake.params.guided_decoding.kwargs["structural_tag"])
    assert tag["triggers"] == ["<tool_call>"] and [s["schema"] for s in tag["structures"]] == [
        t["function"]["parameters"] for t in TOOLS]
    [calculator] = [s for s in tag["structures"] if '"calculator"' in s["begin"]]
    guided_output = calculator["begin"] + '{"expression": "3*3"}' + calculator["end"]
    assert [(c.name, json.loads(c.arguments)) for c in tool_call_text.parse(guided_output)[1]] == [
        ("calculator", {"expression": "3*3"})]
    await backend.close()
