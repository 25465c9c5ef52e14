"""The HTTP gateway end to end, on the real broker and database: one pipeline (scripted model, chunked
tokens) and two gateway replicas served by uvicorn on free ports, shared by the module. Submit over HTTP
(idempotent), stream a run's events as SSE, disconnect mid-stream and resume on the other replica with
Last-Event-ID getting exactly what was missed, approve a tool call with the approver taken from the token, 401/403/404, the
sessions' routes, and the real ``openai`` package as a client, plain and streamed."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
import uvicorn

from agentstream.devstack.process import free_port
from agentstream.services.gateway.app import create_app
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.services.gateway.tokens import Role, create
from agentstream.services.worker import WorkerOptions
from agentstream.testing import Pipeline, isolated

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")


class Door:
    """The gateway's URL (and a second replica's), tokens by role (tenant ``default``: the pipeline's cell;
    ``other``: another tenant's submitter), and the pipeline behind it."""

    def __init__(self, url: str, replica: str, tokens: dict[str, str], pipe: Pipeline) -> None:
        self.url = url
        self.replica = replica
        self.tokens = tokens
        self.pipe = pipe

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def door(settings, effects_table) -> AsyncIterator[Door]:
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS,
                            backend_options={"chunk_chars": 6, "chunk_delay_s": 0.03})
    async with Pipeline.start(isolated(settings, f"gw{uuid.uuid4().hex[:8]}."), options) as pipe:
        pool = await pipe.client.pool()
        tokens = {role.value: (await create(pool, tenant="default", role=role, name=f"test-{role.value}"))[0]
                  for role in Role}
        tokens["other"] = (await create(pool, tenant="other", role=Role.SUBMITTER))[0]
        ports = [free_port(), free_port()]
        servers = [uvicorn.Server(uvicorn.Config(create_app(pipe.settings, GatewaySettings(port=port, keepalive_s=1.0)),
                                                 host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                                 lifespan="on")) for port in ports]
        serving = [asyncio.create_task(server.serve()) for server in servers]
        while not all(server.started for server in servers):
            assert not any(task.done() for task in serving), "uvicorn did not start"
            await asyncio.sleep(0.02)
        try:
            yield Door(f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}", tokens, pipe)
        finally:
            for server in servers:
                server.should_exit = True
            await asyncio.gather(*serving)


async def sse(response: httpx.Response) -> AsyncIterator[dict]:
    """The SSE messages of a response: ``{"id", "event", "data"}`` (comments skipped)."""
    message: dict = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in message:
                yield message
            message = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            message[field] = value[1:] if value.startswith(" ") else value


async def submit(client: httpx.AsyncClient, door: Door, task: str, **fields: object) -> str:
    response = await client.post(f"{door.url}/v1/runs", json={"task": task, "prefetch": False, **fields},
                                 headers=door.auth("submitter"))
    assert response.status_code == 202, response.text
    return response.json()["run_id"]


async def test_a_run_streams_over_sse_and_a_client_that_drops_resumes_with_nothing_lost(door: Door) -> None:
    task = '[[tool:calculator {"expression": "6 * 7"}]] [[answer:The answer, computed with care, is forty-two (42).]]'
    async with httpx.AsyncClient(timeout=30) as client:
        key = {"Idempotency-Key": f"order-{uuid.uuid4().hex[:6]}"}
        response = await client.post(f"{door.url}/v1/runs", json={"task": task, "tools": ["calculator"],
                                                                   "prefetch": False},
                                      headers={**door.auth("submitter"), **key})
        assert response.status_code == 202 and response.headers["Location"] == f"/v1/runs/{response.json()['run_id']}"
        run_id = response.json()["run_id"]
        again = await client.post(f"{door.url}/v1/runs", json={"task": task, "tools": ["calculator"], "prefetch": False},
                                  headers={**door.auth("submitter"), **key})
        assert again.json()["run_id"] == run_id  # the same key names the same run

        first: list[dict] = []
        async with client.stream("GET", f"{door.url}/v1/runs/{run_id}/events", headers=door.auth("reader")) as live:
            assert live.headers["content-type"].startswith("text/event-stream")
            async for message in sse(live):
                first.append(message)
                if sum(m["event"] == "token" for m in first) == 3 and first[-1]["event"] == "token":
                    break  # the client goes away mid-stream
        rest: list[dict] = []  # resumed on the other replica: the id is a place in Kafka, not in one process
        headers = {**door.auth("reader"), "Last-Event-ID": first[-1]["id"]}
        async with client.stream("GET", f"{door.replica}/v1/runs/{run_id}/events", headers=headers) as resumed:
            async for message in sse(resumed):
                rest.append(message)
        whole: list[dict] = []
        async with client.stream("GET", f"{door.url}/v1/runs/{run_id}/events", headers=door.auth("reader")) as replay:
            async for message in sse(replay):  # the run has ended: all of it, then the end of the stream
                whole.append(message)
        done = await client.get(f"{door.url}/v1/runs/{run_id}/events",
                                headers={**door.auth("reader"), "Last-Event-ID": whole[-1]["id"]})
        assert done.status_code == 204  # read to its end: an EventSource stops reconnecting
        metrics = (await client.get(f"{door.url}/metrics")).text
        delivered = next(line for line in metrics.splitlines()
                         if line.startswith("agentstream_gateway_token_delivery_seconds_count"))
        assert float(delivered.split()[-1]) >= len([m for m in whole if m["event"] == "token"])  # this replica's

    joined = first + rest
    assert len({m["id"] for m in joined}) == len(joined)  # nothing repeated
    for kind in ("token", "step", "outcome"):  # nothing lost, each kind in its order (topics interleave freely)
        assert [m["data"] for m in joined if m["event"] == kind] == [m["data"] for m in whole if m["event"] == kind]
    assert [m["event"] for m in whole].count("outcome") == 1 and whole[-1]["event"] == "outcome"
    outcome = json.loads(whole[-1]["data"])
    assert outcome["status"] == "completed" and outcome["answer"] == "The answer, computed with care, is forty-two (42)."
    steps = [json.loads(m["data"]) for m in whole if m["event"] == "step"]
    assert [s["kind"] for s in steps] == ["model", "tool", "model"] and steps[1]["result"] == "42"
    for step in (s for s in steps if s["kind"] == "model"):  # every token of each model step, in order
        tokens = [json.loads(m["data"]) for m in whole if m["event"] == "token"]
        mine = [t for t in tokens if t["step_id"] == step["step_id"]]
        assert [t["seq"] for t in mine] == list(range(len(mine))) and "".join(t["text"] for t in mine) == step["text"]
    assert sum(m["event"] == "token" for m in whole) > 6


async def test_reads_and_who_may_do_what(door: Door) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        run_id = await submit(client, door, "[[answer:done]]")
        result = await door.pipe.client.wait(run_id, timeout=20)
        assert result.ok
        view = await client.get(f"{door.url}/v1/runs/{run_id}", headers=door.auth("reader"))
        assert view.status_code == 200
        body = view.json()
        assert (body["status"], body["answer"], body["step_count"]) == ("completed", "done", 1)
        assert body["steps"][0]["kind"] == "model"
        # another tenant's run does not exist for it; a run nobody submitted neither
        for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
            other = await client.get(f"{door.url}{path}", headers=door.auth("other"))
            assert other.status_code == 404 and other.headers["content-type"] == "application/problem+json"
        assert (await client.post(f"{door.url}/v1/runs/{run_id}/cancel", headers=door.auth("other"))).status_code == 404
        assert (await client.get(f"{door.url}/v1/runs/run-nobody", headers=door.auth("reader"))).status_code == 404
        assert (await client.get(f"{door.url}/v1/runs/{run_id}")).status_code == 401
        assert (await client.get(f"{door.url}/v1/runs/{run_id}", headers={"Authorization": "Bearer ags_000000000000_x"})
                ).status_code == 401
        forbidden = await client.post(f"{door.url}/v1/runs", json={"task": "x"}, headers=door.auth("reader"))
        assert forbidden.status_code == 403
        refused = await client.post(f"{door.url}/v1/runs", json={"task": "x", "tools": ["no_such_tool"]},
                                    headers=door.auth("submitter"))
        assert refused.status_code == 422 and "unknown tool" in refused.json()["detail"]
        nobody = await client.post(f"{door.url}/v1/runs", json={"task": "x", "agent": "nobody"},
                                   headers=door.auth("submitter"))
        assert nobody.status_code == 422 and "nobody" in nobody.json()["detail"]  # an agent never registered
        bad_schema = await client.post(f"{door.url}/v1/runs", json={"task": "x", "output_schema": {"type": "nope"}},
                                       headers=door.auth("submitter"))
        assert bad_schema.status_code == 422 and bad_schema.json()["type"].endswith("/task-rejected")

        slow = await submit(client, door, "[[slow:10000]] [[answer:too late]]")
        cancel = await client.post(f"{door.url}/v1/runs/{slow}/cancel", json={"reason": "changed my mind"},
                                   headers=door.auth("submitter"))
        assert cancel.status_code == 202 and cancel.json()["status"] == "cancelling"
        ended = await door.pipe.client.wait(slow, timeout=20)
        assert ended.error_code == "cancelled"


async def test_an_approval_over_http_is_the_tokens_not_the_bodys(door: Door) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        run_id = await submit(client, door, '[[tool:transfer {"amount": 5}]] [[answer:sent]]', tools=["transfer"])
        waiting: list = []
        for _ in range(100):
            listed = await client.get(f"{door.url}/v1/approvals", headers=door.auth("reader"))
            waiting = [a for a in listed.json()["approvals"] if a["run_id"] == run_id]
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting and waiting[0]["tool"] == "transfer" and waiting[0]["arguments"] == {"amount": 5}
        other = await client.get(f"{door.url}/v1/approvals", headers=door.auth("other"))
        assert all(a["run_id"] != run_id for a in other.json()["approvals"])
        step = waiting[0]["step_id"]
        url = f"{door.url}/v1/approvals/{run_id}/{step}/approve"
        assert (await client.post(url, headers=door.auth("reader"))).status_code == 403
        forged = await client.post(url, json={"decided_by": "mallory"}, headers=door.auth("approver"))
        assert forged.status_code == 422
        decided = await client.post(url, json={"reason": "looks right"}, headers=door.auth("approver"))
        assert decided.status_code == 200, decided.text
        assert decided.json()["approved"] and decided.json()["decided_by"] == "gateway:default:test-approver"
        assert (await door.pipe.client.wait(run_id, timeout=20)).answer == "sent"
        again = await client.post(url, headers=door.auth("approver"))
        assert again.status_code == 409  # no longer waiting


async def test_sessions_over_http(door: Door) -> None:
    session = f"chat-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(timeout=30) as client:
        first = await submit(client, door, "[[answer:Hello Ada]]", session=session)
        assert door.pipe.client.topics.partition_for(first) == door.pipe.client.topics.partition_for(session)
        await door.pipe.client.wait(first, timeout=20)
        listed = await client.get(f"{door.url}/v1/sessions", headers=door.auth("reader"))
        assert session in [s["session_id"] for s in listed.json()["sessions"]]
        shown = await client.get(f"{door.url}/v1/sessions/{session}", headers=door.auth("reader"))
        assert shown.status_code == 200 and shown.json()["turns"] == 1 and shown.json()["going"] == []
        assert (await client.get(f"{door.url}/v1/sessions/{session}", headers=door.auth("other"))).status_code == 404
        deleted = await client.delete(f"{door.url}/v1/sessions/{session}", headers=door.auth("submitter"))
        assert deleted.status_code == 200 and deleted.json() == {"session_id": session, "stopping": []}
        assert (await client.delete(f"{door.url}/v1/sessions/nope-{session}",
                                    headers=door.auth("submitter"))).status_code == 404


async def test_the_openai_sdk_talks_to_an_agent_unchanged(door: Door) -> None:
    import openai

    def chat() -> tuple[str, str, list[str], list[str]]:
        client = openai.OpenAI(base_url=f"{door.url}/v1", api_key=door.tokens["submitter"], max_retries=0)
        assert [m.id for m in client.models.list()] == ["agentstream"]
        plain = client.chat.completions.create(model="agentstream", messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "[[answer:Paris is the capital of France.]]"}])
        assert plain.object == "chat.completion" and plain.choices[0].finish_reason == "stop"
        assert plain.usage is not None and plain.usage.total_tokens > 0
        pieces: list[str] = []
        kinds: list[str] = []
        with client.chat.completions.create(model="agentstream", stream=True, stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": '[[tool:calculator {"expression": '
                                                       '"2 + 3"}]] [[answer:Two and three make five, as computed.]]'}]
                                            ) as stream:
            for chunk in stream:
                kinds.append(chunk.object)
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        try:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        except openai.NotFoundError as exc:
            missing = str(exc)
        return plain.choices[0].message.content or "", missing, pieces, kinds

    content, missing, pieces, kinds = await asyncio.to_thread(chat)
    assert content == "Paris is the capital of France."
    assert "gpt-4o" in missing
    assert "".join(pieces) == "Two and three make five, as computed." and len(pieces) > 2  # as it was written
    assert set(kinds) == {"chat.completion.chunk"}


async def test_a_registered_agent_is_a_model_and_an_agent_of_runs(door: Door) -> None:
    import openai

    from agentstream.streams.core.agents import Agent

    name = f"calc-{uuid.uuid4().hex[:6]}"
    await door.pipe.client.agents.register(Agent(name=name, tools=["calculator"], max_steps=4, prefetch=False))

    def chat() -> tuple[list[str], str]:
        client = openai.OpenAI(base_url=f"{door.url}/v1", api_key=door.tokens["submitter"], max_retries=0)
        models = [m.id for m in client.models.list()]
        reply = client.chat.completions.create(model=name, temperature=0.7, messages=[  # settings: the agent's
            {"role": "user", "content": '[[tool:calculator {"expression": "3 * 4"}]] [[answer:twelve]]'}])
        return models, reply.choices[0].message.content or ""

    models, content = await asyncio.to_thread(chat)
    assert models[0] == "agentstream" and name in models and content == "twelve"
    async with httpx.AsyncClient(timeout=30) as client:
        accepted = await client.post(f"{door.url}/v1/runs", json={"task": "[[answer:by the agent]]", "agent": name},
                                     headers=door.auth("submitter"))
        assert accepted.status_code == 202, accepted.text
        assert (await door.pipe.client.wait(accepted.json()["run_id"], timeout=20)).answer == "by the agent"
        fixed = await client.post(f"{door.url}/v1/runs", json={"task": "x", "agent": name, "tools": ["calculator"]},
                                  headers=door.auth("submitter"))
        assert fixed.status_code == 422 and "from the agent's definition" in fixed.json()["detail"]
