"""The planner service: one event in, one transition, its outputs out — never waiting on another service.

Per event (the runtime runs a run's events one after another, different runs in parallel):

1. load the run's state (memory; on a miss, PostgreSQL);
2. an event that changes nothing is a copy or stale: if it is the event applied last, republish the
   state's outputs (repairs a crash between the database commit and the publish); otherwise drop it;
3. ``machine.start``/``advance``; one (group-committed) transaction records the event, the steps and
   the new state, with a version check;
4. publish ``machine.outputs(state)``; the runtime commits the offset once the broker has them.

Deadlines: a timer fails runs past their deadline through the same per-run queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from aiokafka import TopicPartition

from services.planner import machine
from services.planner.state import AWAITING_APPROVAL, TERMINAL, RunState
from streams import tracing
from streams.events import (
    ApprovalDecided,
    Event,
    InferenceCompleted,
    InferenceRequested,
    RetrievalCompleted,
    RetrievalRequested,
    RunCancelRequested,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
    event_id_for,
)
from streams.runtime import SOURCE_HEADER, Context, Runtime, ServiceConfig, ServiceRunner
from streams.store import (
    EventRow,
    RunRow,
    SourceUpdate,
    StepResult,
    StepRow,
    Transition,
    TransitionStore,
    VersionConflict,
)
from streams.tool_catalog import ToolCatalog

log = logging.getLogger(__name__)

RESULT_TYPES = (InferenceCompleted, ToolCallCompleted, RetrievalCompleted)
REQUEST_TYPE_FOR = {InferenceCompleted: InferenceRequested, ToolCallCompleted: ToolCallRequested,
                    RetrievalCompleted: RetrievalRequested}
SERVICE_FOR = {InferenceCompleted: "inference", ToolCallCompleted: "tools", RetrievalCompleted: "retrieval"}
MAX_TASK_STEPS = 1000


class Planner:
    def __init__(self, runtime: Runtime, store: TransitionStore, tools: ToolCatalog, *,
                 cache_size: int = 100_000, deadline_tick_s: float = 0.25) -> None:
        self.runtime = runtime
        self.store = store
        self.tools = tools
        self.cache: OrderedDict[str, RunState] = OrderedDict()
        self.cache_size = cache_size
        self.deadline_tick_s = deadline_tick_s
        self.assigned: set[int] = set()
        self.runner: ServiceRunner | None = None
        self._expiring: set[str] = set()

    def service(self, *, concurrency: int = 64, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        config = ServiceConfig(name="planner", topics=topics.planner_inputs, group_id=topics.group("planner"),
                               concurrency=concurrency, **overrides)
        self.runner = ServiceRunner(self.runtime, config, self.handle, on_assigned=self._on_assigned,
                                    on_revoked=self._on_revoked)
        return self.runner

    # -- the handler ---------------------------------------------------------------------------
    async def handle(self, event: Event, ctx: Context) -> None:
        if isinstance(event, TaskSubmitted):
            await self._on_task(event, ctx)
        elif isinstance(event, RESULT_TYPES):
            await self._on_result(event, ctx)
        elif isinstance(event, RunCancelRequested):
            await self._on_cancel(event, ctx)
        elif isinstance(event, ApprovalDecided):
            await self._on_decision(event, ctx)
        else:
            raise TypeError(f"the planner does not handle {type(event).__name__}")

    async def _on_task(self, task: TaskSubmitted, ctx: Context) -> None:
        state = self.cache.get(task.run_id)
        if state is None:
            try:
                await self._start(task, ctx)
                return
            except VersionConflict:  # recorded before (a redelivery after a restart)
                state = await self._load(task.run_id)
        await self._transition(state, None, ctx, task)

    async def _start(self, task: TaskSubmitted, ctx: Context) -> None:
        """A new run. Its row is inserted without looking first: a run id that exists makes the
        insert conflict, which costs a query only on the rare redelivery instead of on every task."""
        now = datetime.now(UTC)
        problem = await self._task_problem(task)
        tools = await self.tools.describe(task.tools) if problem is None else []
        state = machine.start(task, tools, now)
        if problem is not None:
            state = machine.fail(state, now, "invalid_task", problem)
        state = replace(state, traceparent=ctx.traceparent or ctx.out_traceparent,  # the run's trace
                        topic_prefix=self.runtime.topics.prefix)
        await self._transition(None, state, ctx, task)

    async def _on_result(self, result: InferenceCompleted | ToolCallCompleted | RetrievalCompleted,
                         ctx: Context) -> None:
        state = await self._load(result.run_id)
        new = None
        if state is None:
            log.warning("planner: %s for unknown run %s dropped", type(result).__name__, result.run_id)
        elif machine.is_prefetch_result(state, result):
            assert isinstance(result, RetrievalCompleted)
            new = machine.prefetched(state, result, datetime.now(UTC))
        elif machine.is_pending_result(state, result):
            new = machine.advance(state, result, datetime.now(UTC))
        await self._transition(state, new, ctx, result)

    async def _on_cancel(self, request: RunCancelRequested, ctx: Context) -> None:
        state = await self._load(request.run_id)
        new = machine.cancel(state, datetime.now(UTC), request.reason) if state is not None else None
        await self._transition(state, new, ctx, request)  # None: unknown, or already over

    async def _on_decision(self, decision: ApprovalDecided, ctx: Context) -> None:
        state = await self._load(decision.run_id)
        new = machine.decide(state, decision, datetime.now(UTC)) if state is not None else None
        if state is not None and new is None:
            log.info("planner: decision on %s ignored (not awaiting approval for that step)", decision.step_id)
        await self._transition(state, new, ctx, decision)

    async def _transition(self, old: RunState | None, new: RunState | None, ctx: Context, consumed: Event) -> None:
        """Record and publish ``new``; or, when the event changes nothing, republish ``old``'s outputs if
        the event is a copy of the one applied last (its outputs may not have gone out before a crash).
        Republishing is harmless: the same events, with the same ids, which consumers drop."""
        if new is None:
            if old is not None and consumed.event_id == old.last_event_id:
                await self._publish(machine.outputs(old, self.runtime.topics), old, ctx)
            return
        new = replace(new, last_event_id=consumed.event_id)
        outputs = machine.outputs(new, self.runtime.topics)
        await self._commit(old, new, outputs, ctx, consumed=consumed)
        await self._publish(outputs, new, ctx)

    async def _task_problem(self, task: TaskSubmitted) -> str | None:
        """Submit refuses bad tasks; this guards against tasks published by other means."""
        if not task.task.strip():
            return "the task is empty"
        if not 1 <= task.max_steps <= MAX_TASK_STEPS:
            return f"max_steps must be between 1 and {MAX_TASK_STEPS}"
        unknown = await self.tools.unknown(task.tools)
        if unknown:
            return f"unknown tools: {', '.join(unknown)}"
        return None

    # -- state, history, outputs ---------------------------------------------------------------
    async def _load(self, run_id: str) -> RunState | None:
        state = self.cache.get(run_id)
        if state is not None:
            self.cache.move_to_end(run_id)
            return state
        raw = await self.store.load_state(run_id)
        if raw is None:
            return None
        state = RunState.from_json(raw)
        self._remember(state)
        return state

    def _remember(self, state: RunState) -> None:
        self.cache[state.run_id] = state
        self.cache.move_to_end(state.run_id)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    async def _commit(self, old: RunState | None, new: RunState, outputs: list[tuple[str, Event]],
                      ctx: Context | None, consumed: Event | None) -> None:
        """Record the transition in PostgreSQL (the event, its steps, the new state)."""
        events: list[EventRow] = []
        sources: list[SourceUpdate] = []
        completed: list[StepResult] = []
        if consumed is not None and ctx is not None:
            rec = ctx.record
            events.append(EventRow(event=consumed, topic=rec.topic, partition=rec.partition, offset=rec.offset,
                                   appended_at=rec.appended_at, consumed_at=rec.consumed_at,
                                   consumed_by="planner", traceparent=ctx.traceparent))
            if isinstance(consumed, RESULT_TYPES):
                source = _source(ctx, consumed)
                if source is not None:
                    sources.append(source)
                completed.append(_step_result(consumed, rec.consumed_at))
        requested: list[StepRow] = []
        for topic, event in outputs:
            if topic == self.runtime.topics.runs:
                continue  # snapshots are derived; the state row holds them
            events.append(EventRow(event=event, topic=topic, traceparent=new.traceparent))
            if event.step_id == machine.prefetch_step(new.run_id):
                requested.append(StepRow(step_id=event.step_id, run_id=new.run_id, step_index=-1, kind="prefetch",
                                         request=_step_request(event), requested_at=new.updated_at))
            elif isinstance(event, (InferenceRequested, ToolCallRequested, RetrievalRequested)):
                requested.append(StepRow(step_id=event.step_id, run_id=new.run_id,
                                         step_index=new.step_index - 1, kind=new.pending_kind or "",
                                         request=_step_request(event), requested_at=new.updated_at))
        if new.status == AWAITING_APPROVAL and (old is None or old.status != AWAITING_APPROVAL):
            requested.append(StepRow(step_id=new.pending_step_id or "", run_id=new.run_id,
                                     step_index=new.step_index - 1, kind="tool",
                                     request={**new.pending_request, "awaiting_approval": True},
                                     requested_at=new.updated_at))
        served = new.prefetch_served
        if served and (old is None or old.prefetch_served != served):
            # A retrieval step answered by the prefetch inside this transition: no request event.
            requested.append(StepRow(step_id=served["step_id"], run_id=new.run_id, step_index=served["step_index"],
                                     kind="retrieval", request={"query": served["query"], "from_prefetch": True},
                                     requested_at=new.updated_at))
            completed.append(StepResult(step_id=served["step_id"], status="completed",
                                        result={"passages": list(new.prefetched), "from_prefetch": True,
                                                "saved_ms": served["saved_ms"], "waited": served["waited"]},
                                        error=new.prefetch_error, completed_at=new.updated_at))
        run = RunRow(
            run_id=new.run_id, status=new.status, task=new.task, state=new.to_dict(), version=new.version,
            expected_version=None if old is None else old.version, step_count=new.step_index,
            answer=new.answer, error_code=new.error_code, error=new.error, traceparent=new.traceparent,
            submitted_at=new.submitted_at, updated_at=new.updated_at,
            finished_at=new.updated_at if new.status in TERMINAL else None,
        )
        try:
            await self.store.write(Transition(run=run, events=events, sources=sources,
                                              steps_requested=requested, steps_completed=completed))
        except Exception:
            self.cache.pop(new.run_id, None)  # reload from the database on the retry
            raise
        self._remember(new)

    async def _publish(self, outputs: list[tuple[str, Event]], state: RunState, ctx: Context | None) -> None:
        for topic, event in outputs:
            if ctx is not None:
                await ctx.emit(topic, event)
            else:
                headers = [(tracing.HEADER, tracing.child_of(state.traceparent).encode())]
                await (await self.runtime.send(topic, event, headers=headers))

    # -- deadlines and partitions ---------------------------------------------------------------
    async def run_deadlines(self, stop: asyncio.Event) -> None:
        """Fail runs past their deadline, in each run's own queue (never racing its events)."""
        while not stop.is_set():
            await asyncio.sleep(self.deadline_tick_s)
            now = datetime.now(UTC)
            for state in list(self.cache.values()):
                if (state.deadline is not None and not state.terminal and state.deadline <= now
                        and state.run_id not in self._expiring and self.runner is not None):
                    self._expiring.add(state.run_id)
                    self.runner.run_keyed(state.run_id.encode(), lambda r=state.run_id: self._expire(r))

    async def _expire(self, run_id: str) -> None:
        try:
            state = await self._load(run_id)
            new = machine.expire(state, datetime.now(UTC)) if state is not None else None
            if state is None or new is None:
                return
            outputs = machine.outputs(new, self.runtime.topics)
            await self._commit(state, new, outputs, None, consumed=None)
            await self._publish(outputs, new, None)
        finally:
            self._expiring.discard(run_id)

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Load the active runs of the new partitions, so their deadlines are watched at once."""
        topics = self.runtime.topics
        self.assigned = {tp.partition for tp in assigned if tp.topic == topics.tasks}
        for raw in await self.store.active_states(topics.prefix):
            state = RunState.from_json(raw)
            if topics.partition_for(state.run_id) in self.assigned and state.run_id not in self.cache:
                self._remember(state)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        topics = self.runtime.topics
        gone = {tp.partition for tp in revoked if tp.topic == topics.tasks}
        for run_id in [r for r in self.cache if topics.partition_for(r) in gone]:
            del self.cache[run_id]


def _source(ctx: Context, result: Event) -> SourceUpdate | None:
    """The request this result answers: where and when its service consumed it (from the header)."""
    raw = ctx.record.headers.get(SOURCE_HEADER)
    if not raw:
        return None
    try:
        _topic, partition, offset, appended_ms, consumed_us = raw.decode().rsplit(":", 4)
        appended_at = datetime.fromtimestamp(int(appended_ms) / 1000, UTC)
        consumed_at = datetime.fromtimestamp(int(consumed_us) / 1e6, UTC)
    except ValueError:
        return None
    request_type = REQUEST_TYPE_FOR[type(result)]
    return SourceUpdate(event_id=event_id_for(result.step_id, request_type.__name__, result.attempt),
                        partition=int(partition), offset=int(offset), appended_at=appended_at,
                        consumed_at=consumed_at, consumed_by=SERVICE_FOR[type(result)])


def _step_request(event: Event) -> dict:
    if isinstance(event, ToolCallRequested):
        return {"tool": event.tool, "arguments": json.loads(event.arguments)}
    if isinstance(event, RetrievalRequested):
        return {"query": event.query, "k": event.k}
    assert isinstance(event, InferenceRequested)
    return {"messages": len(event.messages), "model": event.model, "max_tokens": event.max_tokens}


def _step_result(event: Event, at: datetime) -> StepResult:
    if isinstance(event, InferenceCompleted):
        failed = bool(event.error)
        result = {"text": event.text, "finish_reason": event.finish_reason,
                  "prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
                  "cached_prompt_tokens": event.cached_prompt_tokens, "ttft_ms": event.ttft_ms,
                  "duration_ms": event.duration_ms, "model": event.model}
        return StepResult(step_id=event.step_id, status="failed" if failed else "completed", result=result,
                          error=event.error, completed_at=at)
    if isinstance(event, ToolCallCompleted):
        return StepResult(step_id=event.step_id, status="completed" if event.ok else "failed",
                          result={"tool": event.tool, "ok": event.ok, "result": event.result,
                                  "duration_ms": event.duration_ms, "replayed": event.replayed},
                          error=event.error, completed_at=at)
    assert isinstance(event, RetrievalCompleted)
    return StepResult(step_id=event.step_id, status="failed" if event.error else "completed",
                      result={"passages": [p.__dict__ for p in event.passages], "duration_ms": event.duration_ms},
                      error=event.error, completed_at=at)


__all__: Sequence[str] = ["Planner"]
