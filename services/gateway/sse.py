"""Server-Sent Events on the wire: the events a run's stream carries and the response that writes them.

``EventStreamResponse`` rather than Starlette's ``StreamingResponse`` for two things an SSE door needs:
every write has a time limit (a client that stops reading is cut off after ``write_timeout_s`` instead of
holding its connection and stream slot for ever; it resumes with ``Last-Event-ID``), and the stream slot
is released however the response ends (the client went away, the run ended, the replica stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentstream.services.gateway.hub import Item
from agentstream.streams.client.outcomes import parse_output
from agentstream.streams.core.events import (
    InferenceCompleted,
    RetrievalCompleted,
    RunCompleted,
    RunFailed,
    TokenChunk,
    ToolCallCompleted,
)

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"


class TokenData(BaseModel):
    """``event: token``: text a model step generated (``seq`` orders a step's chunks)."""

    run_id: str
    step_id: str
    seq: int
    text: str
    time_ms: int  # the record's timestamp: when the inference service produced it


class ToolCallData(BaseModel):
    id: str
    name: str
    arguments: str


class PassageData(BaseModel):
    id: str
    text: str
    score: float
    source: str | None = None


class StepData(BaseModel):
    """``event: step``: a step's result — a model reply (``kind: model``), a tool call's (``tool``) or a
    retrieval's (``retrieval``); the fields of other kinds are left out."""

    run_id: str
    step_id: str
    kind: Literal["model", "tool", "retrieval"]
    time_ms: int
    text: str | None = None
    finish_reason: str | None = None
    tool_calls: list[ToolCallData] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tool: str | None = None
    ok: bool | None = None
    result: str | None = None
    passages: list[PassageData] | None = None
    error: str | None = None
    duration_ms: float | None = None


class OutcomeData(BaseModel):
    """``event: outcome``: how the run ended; always the stream's last event."""

    run_id: str
    status: Literal["completed", "failed"]
    time_ms: int
    answer: str | None = None
    output: Any = None
    error_code: str | None = None
    error: str | None = None
    steps: int
    duration_ms: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def payload(item: Item) -> tuple[str, BaseModel] | None:
    """The SSE event name and data of a record (None for a record a client has no use for)."""
    e, t = item.event, item.timestamp_ms
    if isinstance(e, TokenChunk):
        return "token", TokenData(run_id=e.run_id, step_id=e.step_id, seq=e.seq, text=e.text, time_ms=t)
    if isinstance(e, InferenceCompleted):
        return "step", StepData(run_id=e.run_id, step_id=e.step_id, kind="model", time_ms=t, text=e.text,
                                finish_reason=e.finish_reason, prompt_tokens=e.prompt_tokens,
                                completion_tokens=e.completion_tokens, error=e.error, duration_ms=e.duration_ms,
                                tool_calls=[ToolCallData(id=c.id, name=c.name, arguments=c.arguments)
                                            for c in e.tool_calls] or None)
    if isinstance(e, ToolCallCompleted):
        return "step", StepData(run_id=e.run_id, step_id=e.step_id, kind="tool", time_ms=t, tool=e.tool, ok=e.ok,
                                result=e.result, error=e.error, duration_ms=e.duration_ms)
    if isinstance(e, RetrievalCompleted):
        return "step", StepData(run_id=e.run_id, step_id=e.step_id, kind="retrieval", time_ms=t, error=e.error,
                                duration_ms=e.duration_ms,
                                passages=[PassageData(id=p.id, text=p.text, score=p.score, source=p.source)
                                          for p in e.passages])
    if isinstance(e, RunCompleted):
        return "outcome", OutcomeData(run_id=e.run_id, status="completed", time_ms=t, answer=e.answer,
                                      output=parse_output(e.output), steps=e.steps, duration_ms=e.duration_ms,
                                      prompt_tokens=e.prompt_tokens, completion_tokens=e.completion_tokens)
    if isinstance(e, RunFailed):
        return "outcome", OutcomeData(run_id=e.run_id, status="failed", time_ms=t, error_code=e.error_code,
                                      error=e.error, steps=e.steps, duration_ms=e.duration_ms)
    return None


def rendered(item: Item) -> tuple[str, str] | None:
    """``payload`` as SSE text, made once per record however many streams show it."""
    done = item.rendered.get("sse", False)
    if done is False:
        shown = payload(item)
        done = item.rendered["sse"] = None if shown is None else (shown[0], json_data(shown[1]))
    return done  # type: ignore[return-value]


def frame(*, data: str, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE message. ``data`` is JSON (one line), so it needs no splitting."""
    head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event else "")
    return f"{head}data: {data}\n\n".encode()


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def json_data(model: BaseModel) -> str:
    return model.model_dump_json(exclude_none=True)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class EventStreamResponse(Response):
    """``text/event-stream`` from an async iterator of frames (see the module docstring)."""

    media_type = MEDIA_TYPE

    def __init__(self, frames: AsyncIterator[bytes], *, write_timeout_s: float,
                 on_close: Callable[[], None] | None = None, cleanup: Callable[[], Awaitable[None]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content=None, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                                **(headers or {})}, media_type=MEDIA_TYPE)
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]  # streamed: none
        self.frames = frames
        self.write_timeout_s = write_timeout_s
        self.on_close = on_close
        self.cleanup = cleanup  # for what was opened before the response (a generator never started runs no code)
        self._writing_since: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            tasks = [asyncio.create_task(self._write(send)), asyncio.create_task(_disconnected(receive)),
                     asyncio.create_task(self._watch())]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        finally:
            with contextlib.suppress(Exception):
                await self.frames.aclose()  # type: ignore[attr-defined]
            if self.cleanup is not None:
                with contextlib.suppress(Exception):
                    await self.cleanup()
            if self.on_close is not None:
                self.on_close()

    async def _write(self, send: Send) -> None:
        clock = asyncio.get_running_loop().time
        try:
            async for chunk in self.frames:
                self._writing_since = clock()  # watched by _watch: no timer per write (a thousand streams write)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self._writing_since = None
        except (asyncio.CancelledError, OSError):
            raise
        except Exception:
            log.exception("gateway: an SSE stream failed")  # the client sees the stream end, and resumes
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self) -> None:
        """Return (ending the response) once a write has waited ``write_timeout_s`` for the client to read."""
        clock = asyncio.get_running_loop().time
        while True:
            await asyncio.sleep(self.write_timeout_s / 4)
            since = self._writing_since
            if since is not None and clock() - since > self.write_timeout_s:
                log.info("gateway: an SSE client read nothing for %.0f s; its stream was closed", self.write_timeout_s)
                return


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


__all__ = ["MEDIA_TYPE", "EventStreamResponse", "OutcomeData", "StepData", "TokenData", "comment", "dumps",
           "frame", "json_data", "payload", "rendered"]
