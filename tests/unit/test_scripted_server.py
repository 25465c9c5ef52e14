"""The scripted model server (services/inference/scripted_server.py) speaks what the ``openai`` backend
sends and expects: the backend streams the reply ``scripted_reply`` gives for the same conversation,
with usage; tool turns come back as tool messages; the non-streaming form and ``/health`` answer; and the
module runs as ``python -m agentstream.services.inference.scripted_server``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.openai_compat import OpenAIBackend
from agentstream.services.inference.backends.scripted import scripted_reply
from agentstream.services.inference.scripted_server import ScriptedServer, ServerConfig, to_messages

ROOT = Path(__file__).resolve().parents[2]
TASK = '[[tool:calculator {"expression": "17 * 23"}]] [[answer:391]]'


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    async with TestServer(ScriptedServer(ServerConfig(chunk_chars=8)).app(), host="127.0.0.1") as srv:
        yield srv


@pytest.fixture
async def backend(server: TestServer) -> AsyncIterator[OpenAIBackend]:
    engine = OpenAIBackend(base_url=str(server.make_url("/v1")), slots=2, max_retries=0)
    await engine.start()
    yield engine
    await engine.close()


async def _generate(backend: OpenAIBackend, *messages: ChatMessage) -> tuple[list[Delta], Final]:
    items = [item async for item in backend.generate(GenerationRequest(request_id="s", messages=messages))]
    assert all(isinstance(i, Delta) for i in items[:-1]) and isinstance(items[-1], Final)
    return items[:-1], items[-1]  # type: ignore[return-value]


async def test_openai_backend_streams_the_scripted_reply(backend: OpenAIBackend) -> None:
    assert backend.model == "scripted"  # the first (only) id of GET /v1/models
    messages = (ChatMessage(role="system", content="You are an agent."), ChatMessage(role="user", content=TASK))
    deltas, final = await _generate(backend, *messages)
    expected, _ = scripted_reply(messages)
    assert len(deltas) > 1  # streamed in several chunks
    assert final.text == "".join(d.text for d in deltas) == expected
    assert json.loads(final.text) == {"action": "tool", "tool": "calculator", "arguments": {"expression": "17 * 23"}}
    assert final.finish_reason == "stop"
    assert final.prompt_tokens == sum(len(m.content.split()) for m in messages)
    assert final.completion_tokens == len(expected.split())


async def test_tool_turns_become_tool_messages_again(backend: OpenAIBackend) -> None:
    """The backend sends a tool result as a user turn; the reply must be the one the scripted backend
    gives for the original conversation (its second directive, then an answer quoting the result)."""
    conversation = (ChatMessage(role="user", content=TASK),
                    ChatMessage(role="assistant", content="{}"),
                    ChatMessage(role="tool", name="calculator", content="391"))
    _, final = await _generate(backend, *conversation)
    assert final.text == scripted_reply(conversation)[0]
    assert json.loads(final.text) == {"action": "final_answer", "answer": "391"}
    quoted = (ChatMessage(role="user", content="[[tool:calculator {}]]"), *conversation[1:])
    _, final = await _generate(backend, *quoted)
    assert json.loads(final.text)["answer"] == "Based on the last step: 391"


def test_to_messages_only_maps_turns_after_the_task() -> None:
    raw = [{"role": "user", "content": "[calculator result] not a tool turn: this is the task"},
           {"role": "assistant", "content": "{}"},
           {"role": "user", "content": "[calculator result] 4"}]
    messages = to_messages(raw)
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[2].name == "calculator" and messages[2].content == "4"


async def test_non_streaming_completion_and_health(server: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "[[answer:hello]]"}]}
        async with session.post(server.make_url("/v1/chat/completions"), json=body) as resp:
            assert resp.status == 200
            reply = await resp.json()
        assert reply["object"] == "chat.completion"
        assert json.loads(reply["choices"][0]["message"]["content"]) == {"action": "final_answer", "answer": "hello"}
        assert reply["usage"]["completion_tokens"] > 0
        async with session.post(server.make_url("/v1/chat/completions"), json={"messages": "nope"}) as resp:
            assert resp.status == 400
        async with session.get(server.make_url("/health")) as resp:
            health = await resp.json()
        assert health["status"] == "ok" and health["served"] == 1 and health["active"] == 0


async def test_a_client_that_goes_away_aborts_a_slow_generation(server: TestServer, backend: OpenAIBackend) -> None:
    """A cancelled generation must free the server's slot while the reply is still being "thought" about:
    the keep-alive comments written during a ``[[slow:MS]]`` wait reveal the closed connection."""
    request = GenerationRequest(request_id="slow", messages=(ChatMessage(role="user", content="[[slow:5000]] hi"),))
    task = asyncio.create_task(anext(backend.generate(request)))
    await asyncio.sleep(0.3)
    task.cancel()
    async with aiohttp.ClientSession() as session:
        for _ in range(40):
            async with session.get(server.make_url("/health")) as resp:
                health = await resp.json()
            if health["aborted"]:
                break
            await asyncio.sleep(0.1)
    assert health["aborted"] == 1 and health["active"] == 0


async def test_runs_as_a_module() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentstream.services.inference.scripted_server", "--port", "0", cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert "listening on http://127.0.0.1:" in line, line
        base = line.split()[-3]  # "... listening on http://127.0.0.1:PORT/v1 (model scripted)"
        async with aiohttp.ClientSession() as session, session.get(base.removesuffix("/v1") + "/health") as resp:
            assert (await resp.json())["status"] == "ok"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
