"""What a transition writes and publishes: its rows for the history (PostgreSQL: the event consumed, the
steps requested and completed, the run's new state) and the order its outputs go out in.

Publish order: a model or retrieval request has no effect outside its run (``EARLY``), so it goes out
while its transition is recorded, instead of after. A tool call may act on the world, and an outcome is
final: both wait for the record (the tool service's claim, streams/store/tool_calls.py, relies on it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from agentstream.services.planner import fanout, machine, transcript
from agentstream.services.planner.state import (
    AWAITING_APPROVAL,
    COMPLETED,
    FAILED,
    TERMINAL,
    RunState,
    request_to_dict,
)
from agentstream.streams.core.events import (
    Event,
    InferenceCompleted,
    InferenceRequested,
    RetrievalCompleted,
    RetrievalRequested,
    SessionUpdated,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.ids import event_id_for
from agentstream.streams.core.kinds import PendingKind
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.headers import SOURCE_HEADER
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context
from agentstream.streams.store.history import (
    EventRow,
    Lease,
    RunRow,
    SourceUpdate,
    StepResult,
    StepRow,
    Transition,
)
from agentstream.streams.store.sessions import SessionWrite
from agentstream.streams.telemetry import trace_context as tracing

#: A run's outputs: (topic, event), in the order they are published.
Outputs = list[tuple[str, Event]]

RESULT_TYPES = (InferenceCompleted, ToolCallCompleted, RetrievalCompleted)
#: The ``steps.kind`` of each request the planner publishes.
REQUEST_KINDS: dict[type[Event], PendingKind] = {
    InferenceRequested: "model", ToolCallRequested: "tool", RetrievalRequested: "retrieval"}
REQUEST_TYPE_FOR = {InferenceCompleted: InferenceRequested, ToolCallCompleted: ToolCallRequested,
                    RetrievalCompleted: RetrievalRequested}
SERVICE_FOR = {InferenceCompleted: "inference", ToolCallCompleted: "tools", RetrievalCompleted: "retrieval"}
#: Requests without effects outside their run (a model call, a search), published while their transition
#: is recorded. A tool call may act on the world, and an outcome is final: both wait for the record.
EARLY: frozenset[type[Event]] = frozenset({InferenceRequested, RetrievalRequested})


def split_early(outputs: Outputs) -> tuple[Outputs, Outputs]:
    """``outputs`` as (what goes out while the transition is recorded, what waits for the record)."""
    early = [(t, e) for t, e in outputs if type(e) in EARLY]
    later = [(t, e) for t, e in outputs if type(e) not in EARLY] if early else outputs
    return early, later


async def send(runtime: Runtime, outputs: Outputs, state: RunState, ctx: Context | None) -> None:
    """Publish ``outputs`` in order: through the record being handled (``ctx``: it is done once the
    broker has them), or, outside any record, each awaited in the run's trace. The calls of a fan-out
    are keyed by their own step id, not the run: the tool service handles a key's records one after
    another, and these are to run side by side (a copy of one call still queues behind it)."""
    for topic, event in outputs:
        key = event.step_id if isinstance(event, ToolCallRequested) and state.pending_kind == "tools" else None
        if isinstance(event, SessionUpdated):
            key = event.session  # the session's mirror: compacted by session (its partition is the run's)
        if ctx is not None:
            await ctx.emit(topic, event, key=key)
        else:
            headers = [(tracing.HEADER, tracing.child_of(state.traceparent).encode())]
            await (await runtime.send(topic, event, key=key, headers=headers))


def transition(old: RunState | None, new: RunState, outputs: Outputs, ctx: Context | None, consumed: Event | None,
               topics: Topics, lease: Lease) -> Transition:
    """The rows that record the move from ``old`` to ``new`` (the event consumed, where its request was
    consumed, the steps ``outputs`` request and the one ``consumed`` completes, the run's row), under
    ``lease``."""
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
        if topic in (topics.runs, topics.sessions):
            continue  # snapshots and the session's mirror are derived; the state and sessions rows hold them
        events.append(EventRow(event=event, topic=topic, traceparent=new.traceparent))
        if event.step_id == machine.prefetch_step(new.run_id):
            requested.append(StepRow(step_id=event.step_id, run_id=new.run_id, step_index=-1, kind="prefetch",
                                     request=_step_request(event), requested_at=new.updated_at))
        elif isinstance(event, ToolCallRequested) and new.pending_kind == "tools":
            requested.append(_call_row(new, event.step_id, _step_request(event)))
        elif isinstance(event, TaskSubmitted) and event.parent_run_id == new.run_id and event.parent_step_id:
            # A sub-agent call: the parent's step starts a child run (services/planner/subagents.py).
            call = {"agent": event.agent, "task": event.task, "child_run_id": event.run_id}
            requested.append(_call_row(new, event.parent_step_id, call) if new.pending_kind == "tools" else StepRow(
                step_id=event.parent_step_id, run_id=new.run_id, step_index=new.step_index - 1, kind="tool",
                request=call, requested_at=new.updated_at))
        elif isinstance(event, (InferenceRequested, ToolCallRequested, RetrievalRequested)):
            requested.append(StepRow(step_id=event.step_id, run_id=new.run_id,
                                     step_index=new.step_index - 1,
                                     kind=new.pending_kind or REQUEST_KINDS[type(event)],
                                     request=_step_request(event), requested_at=new.updated_at))
    batch = fanout.batch_of(new)
    if batch is not None:
        if old is None or old.pending_step_id != new.pending_step_id:
            # The calls of the fan-out that wait for a person are recorded as they fan out (not yet sent).
            requested.extend(_call_row(new, c.step_id, {"tool": c.tool, "arguments": c.arguments,
                                                        "awaiting_approval": True})
                             for c in batch.calls if c.awaiting_approval)
    elif new.status == AWAITING_APPROVAL and (old is None or old.status != AWAITING_APPROVAL):
        requested.append(StepRow(step_id=new.pending_step_id or "", run_id=new.run_id,
                                 step_index=new.step_index - 1, kind="tool",
                                 request={**request_to_dict(new.pending_request), "awaiting_approval": True},
                                 requested_at=new.updated_at))
    served = new.prefetch_served
    if served is not None and (old is None or old.prefetch_served != served):
        # A retrieval step answered by the prefetch inside this transition: no request event.
        requested.append(StepRow(step_id=served.step_id, run_id=new.run_id, step_index=served.step_index,
                                 kind="retrieval", request={"query": served.query, "from_prefetch": True},
                                 requested_at=new.updated_at))
        completed.append(StepResult(step_id=served.step_id, status="completed",
                                    result={"passages": list(new.prefetched), "from_prefetch": True,
                                            "saved_ms": served.saved_ms, "waited": served.waited},
                                    error=new.prefetch_error, completed_at=new.updated_at))
    run = RunRow(
        run_id=new.run_id, status=new.status, task=new.task, state=new.to_dict(), version=new.version,
        expected_version=None if old is None else old.version, step_count=new.step_index,
        answer=new.answer, error_code=new.error_code, error=new.error, traceparent=new.traceparent,
        submitted_at=new.submitted_at, updated_at=new.updated_at,
        finished_at=new.updated_at if new.status in TERMINAL else None,
    )
    return Transition(run=run, events=events, sources=sources, steps_requested=requested,
                      steps_completed=completed, lease=lease, session=_session_write(old, new))


def _session_write(old: RunState | None, new: RunState) -> SessionWrite | None:
    """What a turn's transition writes to its session: its arrival opens the session, its completion
    leaves the transcript it ended with (services/planner/transcript.py); a failed turn writes nothing."""
    if new.session is None:
        return None
    if old is None and new.status != FAILED:
        return SessionWrite(kind="open", prefix=new.topic_prefix, session_id=new.session, run_id=new.run_id,
                            epoch=new.session_epoch, at=new.updated_at)
    after = transcript.finished(new)
    if after is None or (old is not None and old.status == COMPLETED):
        return None
    return SessionWrite(kind="append", prefix=new.topic_prefix, session_id=new.session, run_id=new.run_id,
                        epoch=after.epoch, turns=after.rows(), dropped=after.dropped,
                        tokens=after.tokens, at=new.updated_at)


def _call_row(state: RunState, step: str, request: dict) -> StepRow:
    """The ``steps`` row of call ``step`` of the run's fan-out: its own index, and which call of how many
    (``parallel``: the timeline and ``replay diff`` show the calls of one reply side by side)."""
    k, n = fanout.position(state, step) or (0, 1)
    index = int(step[len(state.run_id) + 1:].partition(":")[0])  # ``{run}:{index}:tool``
    return StepRow(step_id=step, run_id=state.run_id, step_index=index, kind="tool",
                   request={**request, "parallel": {"call": k, "calls": n}}, requested_at=state.updated_at)


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


__all__: Sequence[str] = ["EARLY", "RESULT_TYPES", "Outputs", "send", "split_early", "transition"]
