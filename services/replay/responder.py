"""The recorded-results service: answers a replayed run's requests from the original run's record.

It consumes the three request topics of a replay's own topic prefix (inference, tools, retrieval) and
answers each request with what the ORIGINAL run's step of the same index and kind returned (from
PostgreSQL ``steps``, plus ``tool_calls`` for a tool's error kind and attempts, or, for an idempotent
tool, which keeps no such row, the ``ToolCallCompleted`` the planner recorded in ``events``): the planner
under test sees the same results in the same order, with no model, no tool side effects and no search.
The new run's step ids differ from the original's (they contain the run id), hence the match by index
and kind.

A request with no recorded counterpart — the pipeline decided differently — gets an error result that
says so: a tool call or retrieval whose tool, arguments or query differ from the record is not answered
with the recorded result (that would lie about what the call returns). A model step is matched by index
and kind alone: its recorded reply is the point of a deterministic re-execution, even when the
conversation changed (a different system prompt).

For a fork (``live_from=N``), requests of steps ``>= N`` go to live handlers (the real inference, tool
and retrieval services' ``handle``), which publish on the same replay topics.

A tree of agents replays run by run: the replayed parent's sub-agent calls start child runs in the
replay's pipeline (their ids derived from the new parent's steps), and a child's requests are answered
from the ORIGINAL child's record — the run the original parent's step of the same index started
(``child_plan``, found through the child's recorded parent once its planner has recorded it).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg

from agentstream.services.planner.subagents import child_run_id
from agentstream.streams.core.events import (
    Event,
    InferenceCompleted,
    InferenceRequested,
    Passage,
    RetrievalCompleted,
    RetrievalRequested,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner

SERVICE = "replay"
NO_RECORD = "no_recording"


@dataclass(frozen=True)
class RecordedStep:
    index: int
    kind: str
    status: str
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    error_kind: str | None = None
    attempts: int = 1


@dataclass(frozen=True)
class Recording:
    """What one original run's steps returned, by (index, kind), and the approvals people gave."""

    run_id: str
    steps: dict[tuple[int, str], RecordedStep]
    #: step index → (approved, reason, decided_by)
    approvals: dict[int, tuple[bool, str, str]] = field(default_factory=dict)

    @classmethod
    async def load(cls, pool: asyncpg.Pool | asyncpg.Connection, run_id: str) -> Recording:
        rows = await pool.fetch(
            """SELECT s.step_index, s.kind, s.status, s.request::text AS request, s.result::text AS result,
                      s.error, coalesce(t.error_kind, e.payload->>'error_kind') AS error_kind,
                      coalesce(t.attempts, (e.payload->>'attempts')::int) AS attempts
               FROM steps s LEFT JOIN tool_calls t ON t.step_id = s.step_id
               LEFT JOIN LATERAL (  -- an idempotent tool's call has no tool_calls row: its answer as applied
                   SELECT payload FROM events
                   WHERE run_id = s.run_id AND step_id = s.step_id AND event_type = 'ToolCallCompleted'
                   ORDER BY produced_at LIMIT 1) e ON t.step_id IS NULL AND s.kind = 'tool'
               WHERE s.run_id = $1""", run_id)
        decided = await pool.fetch(
            """SELECT step_id, payload::text AS payload FROM events
               WHERE run_id = $1 AND event_type = 'ApprovalDecided' ORDER BY produced_at""", run_id)
        steps = {(r["step_index"], r["kind"]): RecordedStep(
            index=r["step_index"], kind=r["kind"], status=r["status"], request=json.loads(r["request"]),
            result=json.loads(r["result"]) if r["result"] else None, error=r["error"],
            error_kind=r["error_kind"], attempts=r["attempts"] or 1) for r in rows}
        approvals: dict[int, tuple[bool, str, str]] = {}
        for r in decided:
            index, _ = parse_step(run_id, r["step_id"])
            p = json.loads(r["payload"])
            approvals.setdefault(index, (bool(p.get("approved")), p.get("reason") or "", p.get("decided_by") or ""))
        return cls(run_id, steps, approvals)


def parse_step(run_id: str, step_id: str) -> tuple[int, str]:
    """``{run_id}:{index}:{kind}`` → (index, kind); the prefetch (``{run_id}:prefetch``) is (-1, "prefetch").
    A tool's own retrieval (``…:3:tool/retrieve``) keeps its suffix in the kind."""
    rest = step_id[len(run_id) + 1:] if step_id.startswith(run_id + ":") else step_id
    if rest == "prefetch":
        return -1, "prefetch"
    index, _, kind = rest.partition(":")
    try:
        return int(index), kind
    except ValueError:
        return -2, rest


class Handles(Protocol):
    async def handle(self, event: Event, ctx: Context) -> None: ...


@dataclass
class LiveHandlers:
    """The real services a fork hands its later steps to (any of them may be None: then that kind of
    step gets a no-recording error past the fork point)."""

    inference: Handles | None = None
    tools: Handles | None = None
    retrieval: Handles | None = None

    def for_event(self, event: Event) -> Handles | None:
        if isinstance(event, InferenceRequested):
            return self.inference
        if isinstance(event, ToolCallRequested):
            return self.tools
        return self.retrieval


@dataclass(frozen=True)
class Plan:
    recording: Recording
    #: Steps with index >= live_from are computed live; None: every step from the record.
    live_from: int | None = None


#: How long a request of a run the responder does not know waits for the run to be recorded as the child
#: of a replayed run (its planner publishes the model request while it records the run).
CHILD_WAIT_S = 5.0


class Responder:
    def __init__(self, runtime: Runtime, live: LiveHandlers | None = None, pool: asyncpg.Pool | None = None) -> None:
        self.runtime = runtime
        self.live = live
        self.pool = pool
        self.plans: dict[str, Plan] = {}
        self.stats = {"recorded": 0, "live": 0, "unmatched": 0}

    def expect(self, run_id: str, recording: Recording, live_from: int | None = None) -> None:
        """Answer ``run_id``'s requests from ``recording`` (before its task is published)."""
        if live_from is not None and self.live is None:
            raise ValueError("a fork needs live handlers")
        self.plans[run_id] = Plan(recording, live_from)

    def services(self, *, concurrency: int = 64, **overrides: Any) -> list[ServiceRunner]:
        """One consumer per request topic. One consumer over the three would keep a single fetch in
        flight per broker, and a partition whose records were just handed over is left out of it: its
        next request would wait for that fetch to return (up to the runtime's 100 ms fetch wait)."""
        topics = self.runtime.topics
        return [ServiceRunner(self.runtime, ServiceConfig(
                    name=f"{SERVICE}-{kind}", topics=[topic], group_id=topics.group(f"{SERVICE}-{kind}"),
                    concurrency=concurrency, **overrides), self.handle)
                for kind, topic in (("inference", topics.inference_requests), ("tools", topics.tool_requests),
                                    ("retrieval", topics.retrieval_requests))]

    async def handle(self, event: Event, ctx: Context) -> None:
        if not isinstance(event, (InferenceRequested, ToolCallRequested, RetrievalRequested)):
            raise TypeError(f"the replay responder does not handle {type(event).__name__}")
        plan = self.plans.get(event.run_id) or await self.child_plan(event.run_id)
        if plan is None:
            await self._answer(ctx, event, None, f"run {event.run_id} is not being replayed by this responder")
            return
        index, kind = parse_step(event.run_id, event.step_id)
        if plan.live_from is not None and index >= plan.live_from and self.live is not None:
            handler = self.live.for_event(event)
            if handler is not None:
                self.stats["live"] += 1
                await handler.handle(event, ctx)
                return
        recorded = plan.recording.steps.get((index, kind))
        problem = _mismatch(event, recorded, plan.recording.run_id, index, kind)
        await self._answer(ctx, event, None if problem else recorded, problem)

    async def child_plan(self, run_id: str) -> Plan | None:
        """The plan of ``run_id`` when it is a sub-agent's run started by a replayed run: the original
        child's recording (the run the original parent's step of the same index started), as a fork's
        children are computed live from the fork's step on. None for any other run."""
        if self.pool is None:
            return None
        deadline = time.monotonic() + CHILD_WAIT_S
        while True:
            row = await self.pool.fetchrow("SELECT state->>'parent_run_id' AS parent, state->>'parent_step_id' AS step "
                                           "FROM runs WHERE run_id = $1", run_id)
            if row is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        parent = self.plans.get(row["parent"]) if row is not None and row["parent"] else None
        if parent is None or row is None:
            return None
        index, _ = parse_step(row["parent"], row["step"])
        live = parent.live_from is not None and index >= parent.live_from
        plan = Plan(await Recording.load(self.pool, child_run_id(f"{parent.recording.run_id}:{index}:tool")),
                    0 if live else None)
        self.plans[run_id] = plan
        return plan

    async def _answer(self, ctx: Context, event: Event, step: RecordedStep | None, problem: str | None) -> None:
        started = time.perf_counter()
        self.stats["unmatched" if step is None else "recorded"] += 1
        common: dict[str, Any] = {"run_id": event.run_id, "step": event.step_id, "service": SERVICE,
                                  "attempt": event.attempt, "parent_step_id": event.parent_step_id}
        topics = self.runtime.topics
        result = (step.result or {}) if step is not None else {}
        error = problem or (step.error if step is not None else None)

        def took() -> float:
            return (time.perf_counter() - started) * 1000

        if isinstance(event, InferenceRequested):
            await ctx.emit(topics.inference_results, InferenceCompleted.build(
                **common, text=result.get("text", ""), finish_reason="error" if problem else result.get("finish_reason", "stop"),
                prompt_tokens=int(result.get("prompt_tokens") or 0),
                completion_tokens=int(result.get("completion_tokens") or 0),
                cached_prompt_tokens=int(result.get("cached_prompt_tokens") or 0), ttft_ms=0.0,
                duration_ms=took(), model=result.get("model") or "", backend=SERVICE, error=error))
        elif isinstance(event, ToolCallRequested):
            ok = step is not None and bool(result.get("ok")) and error is None
            await ctx.emit(topics.tool_results, ToolCallCompleted.build(
                **common, tool=event.tool, ok=ok, result=result.get("result") if ok else None,
                error=None if ok else (error or "the recorded call failed"), duration_ms=took(), replayed=True,
                error_kind=NO_RECORD if problem else (None if ok else step.error_kind if step else None),
                attempts=step.attempts if step is not None else 0))
        else:
            assert isinstance(event, RetrievalRequested)
            passages = [Passage(id=str(p["id"]), text=p["text"], score=float(p["score"]), source=p.get("source"))
                        for p in result.get("passages") or []]
            await ctx.emit(topics.retrieval_results, RetrievalCompleted.build(
                **common, passages=passages, error=error, duration_ms=took()))


def _mismatch(event: Event, step: RecordedStep | None, original: str, index: int, kind: str) -> str | None:
    """Why the recorded step cannot answer this request, or None."""
    if step is None:
        return (f"replay: run {original} has no recorded {kind} step {index} "
                "(the replayed pipeline decided differently)")
    if step.result is None and step.error is None:
        return f"replay: {kind} step {index} of run {original} never completed"
    if isinstance(event, ToolCallRequested):
        arguments = json.loads(event.arguments)
        if event.tool != step.request.get("tool") or arguments != step.request.get("arguments"):
            return (f"replay: step {index} called {event.tool}({event.arguments}); the original called "
                    f"{step.request.get('tool')}({json.dumps(step.request.get('arguments'), sort_keys=True)})")
    if isinstance(event, RetrievalRequested) and event.query != step.request.get("query"):
        return f"replay: step {index} searched {event.query!r}; the original searched {step.request.get('query')!r}"
    return None
