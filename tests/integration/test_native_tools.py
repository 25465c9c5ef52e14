"""Native tool calling end to end (streams/core/tool_calling.py): a task that asks for it runs on the
``openai`` backend against the scripted model server (services/inference/scripted_server.py), which
answers a request with ``tools`` with streamed ``tool_calls``, as vLLM or trtllm-serve would; a task that
does not say keeps the JSON actions. Real broker and database; the CPU model cannot call tools natively
(its chat template does not render them: services/inference/backends/llamacpp.py)."""

from __future__ import annotations

import json
import uuid

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from agentstream.services.inference.scripted_server import ScriptedServer, ServerConfig
from agentstream.services.worker import WorkerOptions
from agentstream.testing import Pipeline, isolated

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    async with TestServer(ScriptedServer(ServerConfig()).app(), host="127.0.0.1") as server:
        options = WorkerOptions(backend="openai", backend_options={"base_url": str(server.make_url("/v1")),
                                                                   "slots": 4, "max_retries": 0})
        async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), options) as pipeline:
            yield pipeline


async def test_a_native_task_calls_its_tools_through_the_engines_tool_calls(pipe):
    task = '[[tools:calculator {"expression": "6 * 7"} | calculator {"expression": "2 + 2"}]]'
    run_id = await pipe.client.submit(task, tools=["calculator"], prefetch=False, tool_calling="native")
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer == "Based on the last step: calculator returned: 42 | calculator returned: 4"
    state = json.loads(await (await pipe.client.pool()).fetchval("SELECT state FROM runs WHERE run_id = $1", run_id))
    assert state["tool_calling"] == "native" and json.loads(state["native_tools"])[0]["function"]["name"] == "calculator"
    said, *answers = [m for m in state["messages"] if m.get("tool_calls") or m.get("tool_call_id")]
    assert [c["id"] for c in said["tool_calls"]] == ["call_0_0", "call_0_1"] and said["content"] == ""
    assert [(m["role"], m["tool_call_id"]) for m in answers] == [("tool", "call_0_0"), ("tool", "call_0_1")]
    steps = (await pipe.client.status(run_id))["steps"]
    assert [s["kind"] for s in steps] == ["model", "tool", "tool", "model"]

    plain = await pipe.client.submit('[[tool:calculator {"expression": "1 + 1"}]]', tools=["calculator"],
                                     prefetch=False)  # no choice: the JSON actions, on the same backend
    result = await pipe.client.wait(plain, timeout=30)
    assert result.ok and result.answer == "Based on the last step: calculator returned: 2"
    state = json.loads(await (await pipe.client.pool()).fetchval("SELECT state FROM runs WHERE run_id = $1", plain))
    assert "tool_calling" not in state  # the default, json, is not written
    assert json.loads(state["messages"][2]["content"])["action"] == "tool"
