"""The OpenAI-compatible door: ``POST /v1/chat/completions`` (streamed and not) and ``GET /v1/models``.

An OpenAI SDK, LangChain's ``ChatOpenAI`` or a chat UI pointed at the gateway (``base_url=.../v1``, the
token as the API key) talks to an agent unchanged: ``model`` names the agent — a registered one
(docs/agents.md), or one of the gateway's own names for the pipeline's default agent — the last user message
is its task, and the reply is the run's answer. How the rest of a request maps (docs/gateway.md, "OpenAI"):

- a registered agent decides its prompt, tools, model, settings and limits: the request's sampling settings
  are ignored (SDKs send them by default), its system messages are put before the task's text, and a
  ``response_format`` is refused (the agent decides its output). For the default agent:

- system (and developer) messages become the task's system prompt, put before the agent's instructions;
- with a session (the ``session`` field, or the ``Agentstream-Session`` header) the task is a turn of that
  conversation, and the earlier messages are the session's transcript (what the request repeats of them
  is not sent again); without one, the earlier messages are written into the task as the conversation
  so far;
- ``response_format`` ``json_schema`` is the task's output schema (``json_object``: any object), and the
  reply's content is the JSON the run answered;
- ``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``stop`` and ``seed`` tune every
  model step of the run; ``n`` > 1 and client-side ``tools`` are refused (an agent's tools are its own).

A run that fails answers 502 (504 past its deadline) with the run's ``error_code`` as the error's
``code``; a streamed one ends with an ``error`` data line, which the SDKs raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse

from agentstream.services.gateway.answer_text import AnswerText
from agentstream.services.gateway.auth import Reader, Submitter
from agentstream.services.gateway.hub import is_outcome
from agentstream.services.gateway.openai_models import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChunkChoice,
    Delta,
    Model,
    ModelList,
    Usage,
)
from agentstream.services.gateway.problems import COMMON_RESPONSES, Problem
from agentstream.services.gateway.sse import MEDIA_TYPE as SSE
from agentstream.services.gateway.sse import EventStreamResponse, dumps
from agentstream.services.gateway.state import Gateway, GatewayDep, idempotency_key, run_id_for_key
from agentstream.services.gateway.stream import Emitted, RunStream, SlowReader
from agentstream.streams.core.errors import AgentRejected
from agentstream.streams.core.events import RunCompleted, RunFailed, TokenChunk
from agentstream.streams.core.ids import new_run_id

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["openai"], responses=COMMON_RESPONSES)
_STARTED = int(time.time())


@dataclass(frozen=True)
class ChatTask:
    """What a chat request asks of the agent, as task fields."""

    task: str
    system_prompt: str | None
    session: str | None
    output_schema: dict[str, Any] | None


def compose(body: ChatCompletionRequest, session: str | None) -> ChatTask:
    """The task a chat request stands for (see the module docstring)."""
    *earlier, last = body.messages
    if last.role != "user":
        raise Problem(422, f"the last message must be the user's (it is {last.role!r}): it is the agent's task",
                      slug="invalid-request")
    system = "\n\n".join(m.text() for m in earlier if m.role in ("system", "developer") and m.text().strip())
    task = last.text()
    said = [m for m in earlier if m.role not in ("system", "developer")]
    if said and session is None:
        lines = [f"{_speaker(m)}: {m.text()}" for m in said if m.text().strip()]
        task = "The conversation so far:\n" + "\n".join(lines) + f"\n\nThe user's new message:\n{task}"
    schema: dict[str, Any] | None = None
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise Problem(422, "response_format json_schema needs json_schema.schema", slug="invalid-request")
        schema = fmt.json_schema.schema_
    elif fmt is not None and fmt.type == "json_object":
        schema = {"type": "object"}
    return ChatTask(task=task, system_prompt=system or None, session=session, output_schema=schema)


def _speaker(message: ChatMessage) -> str:
    return {"user": "User", "assistant": "Assistant"}.get(message.role, f"{message.role.title()} ({message.name or 'result'})")


@router.get("/models", response_model=ModelList, summary="The agents, as OpenAI models")
async def models(principal: Reader, gateway: GatewayDep) -> ModelList:
    """The gateway's names for the default agent, then the cell's registered agents (docs/agents.md)."""
    names = list(gateway.config.agents)
    cell = gateway.cells.get(principal.tenant)
    try:
        registered = await (await gateway.cells.connected(cell)).agents.list()
    except Exception as exc:  # the catalogue unreadable (no topics yet, the broker away): the defaults still are
        log.info("gateway: the agent catalogue of %r could not be read (%s)", cell.tenant, exc)
        registered = {}
    names += [name for name in sorted(registered) if name not in names]
    return ModelList(data=[Model(id=name, created=_STARTED) for name in names])


async def _agent_of(gateway: Gateway, tenant: str, model: str) -> str | None:
    """The registered agent a chat request's ``model`` names (None: the gateway's default agent); 404
    ``model_not_found`` for a name that is neither."""
    if model in gateway.config.agents:
        return None
    client = await gateway.cells.connected(gateway.cells.get(tenant))
    try:
        await client.agents.show(model)
    except AgentRejected as exc:
        raise Problem(404, f"the model {model!r} does not exist: {exc}; the default agent: "
                           f"{', '.join(gateway.config.agents)}", slug="model-not-found", code="model_not_found") from None
    return model


@router.post("/chat/completions", response_model=ChatCompletion, summary="Run an agent as a chat completion",
             responses={200: {"content": {SSE: {"schema": {"type": "string"}}},
                              "description": "A ChatCompletion, or with `stream: true` Server-Sent Events, each "
                                             "`data:` a ChatCompletionChunk, then `data: [DONE]`."}})
async def chat_completions(body: ChatCompletionRequest, principal: Submitter, gateway: GatewayDep,
                           key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
                           session_header: Annotated[str | None, Header(alias="Agentstream-Session")] = None,
                           ) -> Response:
    if (body.n or 1) > 1:
        raise Problem(422, "n > 1 is not supported: an agent gives one answer per run", slug="invalid-request")
    if body.tools:
        raise Problem(422, "client-side tools are not supported: the agent calls its own tools on the server "
                           "(leave `tools` out)", slug="invalid-request")
    chat = compose(body, body.session or session_header)
    agent = await _agent_of(gateway, principal.tenant, body.model)
    if agent is not None and chat.output_schema is not None:
        raise Problem(422, f"agent {agent!r} decides its own output: leave response_format out (or register a "
                           "version of the agent with an output schema)", slug="invalid-request")
    if body.stream:
        gateway.streams.acquire()  # before the run starts: a busy replica refuses rather than runs it unseen
    try:
        return await _complete(gateway, principal.tenant, body, chat, idempotency_key(key), agent)
    except BaseException:
        if body.stream:
            gateway.streams.release()
        raise


async def _complete(gateway: Gateway, tenant: str, body: ChatCompletionRequest, chat: ChatTask,
                    key: str | None, agent: str | None) -> Response:
    cell = gateway.cells.get(tenant)
    client = await gateway.cells.connected(cell)
    hub = await gateway.cells.hub(cell)
    existing = None
    if key:
        run_id = run_id_for_key(client.topics, tenant, key, chat.session)
        existing = await gateway.cells.find(run_id)
        if existing is not None and existing.prefix != cell.prefix:
            raise Problem(409, "this Idempotency-Key names a run of another cell", slug="conflict")
    else:
        run_id = client.topics.run_id_for_session(chat.session) if chat.session else new_run_id()
    stream = RunStream(hub, run_id, start=None,
                       submitted_wall=existing.submitted_at.timestamp() if existing else time.time() - 0.5,
                       terminal=existing.terminal if existing else False, keepalive_s=gateway.config.keepalive_s)
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    async with contextlib.AsyncExitStack() as exits:
        await exits.enter_async_context(stream)  # before the task is sent: not a record of the run is missed
        if existing is None and agent is not None:
            # A registered agent decides its prompt, model and settings: the request's sampling settings
            # are left out (SDKs send them by default), its system messages go into the task's text.
            task = f"{chat.system_prompt}\n\n{chat.task}" if chat.system_prompt else chat.task
            await client.submit(task, deadline=gateway.config.chat_deadline_s, metadata=body.metadata,
                                run_id=run_id, session=chat.session, agent=agent)
        elif existing is None:
            await client.submit(chat.task, max_steps=gateway.config.chat_max_steps,
                                deadline=gateway.config.chat_deadline_s, system_prompt=chat.system_prompt,
                                metadata=body.metadata, run_id=run_id, output_schema=chat.output_schema,
                                max_tokens=body.max_completion_tokens or body.max_tokens,
                                temperature=body.temperature, top_p=body.top_p, stop=stop, seed=body.seed,
                                session=chat.session)
        if existing is None:
            client.forget(run_id)
            gateway.metrics.submitted.inc()
        created = int(time.time())
        if body.stream:
            owned = exits.pop_all()  # the stream's subscription now lives as long as the response
            chunks = _chunks(gateway, stream, owned, run_id, body, created,
                             native=client.settings.tool_calling == "native")
            return EventStreamResponse(chunks, write_timeout_s=max(10.0, 2 * gateway.config.keepalive_s),
                                       on_close=gateway.streams.release, cleanup=owned.aclose,
                                       headers={"Agentstream-Run-Id": run_id})
        outcome = await _outcome(stream, gateway.config.chat_deadline_s + 30.0)
    if isinstance(outcome, RunFailed):
        raise _failed(outcome)
    completion = ChatCompletion(
        id=f"chatcmpl-{run_id}", created=created, model=body.model,
        choices=[Choice(message=AssistantMessage(content=outcome.answer), finish_reason="stop")],
        usage=Usage(prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens,
                    total_tokens=outcome.prompt_tokens + outcome.completion_tokens))
    return JSONResponse(completion.model_dump(mode="json"), headers={"Agentstream-Run-Id": run_id})


async def _outcome(stream: RunStream, timeout: float) -> RunCompleted | RunFailed:
    try:
        async with asyncio.timeout(timeout):
            async for emitted in stream.events(drain=False):  # the answer is in the outcome: no tokens needed
                if isinstance(emitted, Emitted) and is_outcome(emitted.item.event):
                    event = emitted.item.event
                    assert isinstance(event, (RunCompleted, RunFailed))
                    return event
    except TimeoutError:
        pass
    raise Problem(504, f"the run {stream.run_id} did not end within {timeout:.0f} s; it goes on "
                       f"(GET /v1/runs/{stream.run_id})", code="timeout")


def _failed(event: RunFailed) -> Problem:
    status = 504 if event.error_code == "deadline_exceeded" else 502
    return Problem(status, f"the run {event.run_id} failed ({event.error_code}): {event.error}",
                   slug="run-failed", code=event.error_code)


async def _chunks(gateway: Gateway, stream: RunStream, exits: contextlib.AsyncExitStack, run_id: str,
                  body: ChatCompletionRequest, created: int, *, native: bool) -> AsyncIterator[bytes]:
    def chunk(delta: Delta, finish: str | None = None, usage: Usage | None = None,
              choices: bool = True) -> bytes:
        data = ChatCompletionChunk(id=f"chatcmpl-{run_id}", created=created, model=body.model,
                                   choices=[ChunkChoice(delta=delta, finish_reason=finish)] if choices else [],  # type: ignore[arg-type]
                                   usage=usage)
        return b"data: " + data.model_dump_json(exclude_none=False).encode() + b"\n\n"

    text = AnswerText(native=native)
    async with exits:
        yield chunk(Delta(role="assistant", content=""))
        try:
            async with asyncio.timeout(gateway.config.chat_deadline_s + 30.0):
                async for emitted in stream.events():
                    if not isinstance(emitted, Emitted):
                        yield b": keepalive\n\n"
                        continue
                    event = emitted.item.event
                    if isinstance(event, TokenChunk):
                        piece = text.feed(event.step_id, event.text)
                        if piece:
                            yield chunk(Delta(content=piece))
                            gateway.metrics.stream_events.inc()
                            gateway.metrics.token_delivery.observe(max(0.0, time.time() - emitted.item.timestamp_ms / 1000))
                    elif isinstance(event, RunFailed):
                        problem = _failed(event)
                        yield _error(problem.detail, "run_failed", event.error_code)
                        return
                    elif isinstance(event, RunCompleted):
                        rest = text.rest(event.answer)
                        if rest:
                            yield chunk(Delta(content=rest))
                        yield chunk(Delta(), finish="stop")
                        if body.stream_options is not None and body.stream_options.include_usage:
                            yield chunk(Delta(), usage=Usage(
                                prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                                total_tokens=event.prompt_tokens + event.completion_tokens), choices=False)
                        yield b"data: [DONE]\n\n"
                        return
        except TimeoutError:
            yield _error(f"the run {run_id} did not end in time; it goes on (GET /v1/runs/{run_id})", "timeout",
                         "timeout")
        except SlowReader:
            yield _error("this reader fell behind and was dropped", "slow_reader", "slow_reader")


def _error(message: str, kind: str, code: str) -> bytes:
    return f"data: {dumps({'error': {'message': message, 'type': kind, 'code': code}})}\n\n".encode()


__all__ = ["ChatTask", "compose", "router"]
