"""Parallel tool calls: the calls of one model reply fan out in one transition and fan in when every
result is back. Pure functions over a run's ``ToolBatch`` (services/planner/state.py), used by
machine.py; no I/O, no clock.

Why each call is a step of its own: it gets its own step index and the ordinary tool step id
(``{run}:{index}:tool``), so the tool service's claim (streams/store/tool_calls.py) runs each one at most
once exactly as it runs a single call, the history has one ``steps`` row per call, and replay matches
each by index. The run's pending step is the batch (``{run}:{first index}:tools``, pending kind
``tools``); its requests are keyed by their step id instead of the run (publishing.py), so the tool
service runs them side by side rather than one after another in the run's queue.

Approval is per call: a call of a tool that needs approval waits for its person (``awaiting_approval``)
while the others run; the run is ``running`` while any call may run and ``awaiting_approval`` once only
calls waiting for a person are left. The model sees every result, in the order it gave the calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agentstream.services.planner import subagents
from agentstream.services.planner.state import AWAITING_APPROVAL, RUNNING, PendingCall, RunState, ToolBatch
from agentstream.streams.core.actions import CallRequest
from agentstream.streams.core.events import Event, Message
from agentstream.streams.core.ids import step_id
from agentstream.streams.core.kinds import RunStatus
from agentstream.streams.kafka.topics import Topics


def plan(state: RunState, calls: Sequence[CallRequest]) -> ToolBatch:
    """The batch for ``calls``, asked for by the model step applied last: call ``k`` is step
    ``state.step_index + k``; the calls that need no approval are sent at once."""
    pending = tuple(PendingCall(step_id=step_id(state.run_id, state.step_index + k, "tool"), tool=c.tool,
                                arguments=c.arguments, awaiting_approval=c.tool in state.approval_tools,
                                call_id=c.call_id)
                    for k, c in enumerate(calls))
    return ToolBatch(asked_by=state.last_step_id or "", calls=pending,
                     send=tuple(c.step_id for c in pending if c.runnable))


def batch_of(state: RunState) -> ToolBatch | None:
    """The run's pending fan-out, if that is what it waits for."""
    request = state.pending_request
    return request if state.pending_kind == "tools" and isinstance(request, ToolBatch) else None


def status(batch: ToolBatch) -> RunStatus:
    """``running`` while a call may run; ``awaiting_approval`` once only calls waiting for a person are left."""
    return RUNNING if any(c.runnable for c in batch.calls) else AWAITING_APPROVAL


def awaits(state: RunState, step: str) -> bool:
    """Whether ``step`` is a call of the run's fan-out that waits for its result."""
    batch = batch_of(state)
    call = batch.call(step) if batch is not None else None
    return call is not None and call.runnable


def with_result(batch: ToolBatch, step: str, content: str) -> ToolBatch:
    """``batch`` once call ``step`` is done, the model to see ``content`` for it; nothing to send."""
    return _with(batch, step, send=(), done=True, content=content)


def decided(batch: ToolBatch, step: str, *, approved: bool, by: str, reason: str) -> ToolBatch | None:
    """``batch`` after a person's decision on call ``step``: approved, it is sent now; denied, it is done
    and the model is told. None when ``step`` is no call of the batch that waits for a decision."""
    call = batch.call(step)
    if call is None or not call.awaiting_approval:
        return None
    if approved:
        return _with(batch, step, send=(step,), awaiting_approval=False, approved_by=by)
    note = f"the call to {call.tool} was denied by a person" + (f": {reason}" if reason else "")
    return _with(batch, step, send=(), awaiting_approval=False, done=True, content=note)


def complete(batch: ToolBatch) -> bool:
    """Every call is done (answered, failed or denied): the fan-in."""
    return all(c.done for c in batch.calls)


def results(batch: ToolBatch) -> list[Message]:
    """What the model sees at the fan-in: one tool message per call, in the order it asked for them."""
    return [Message(role="tool", name=c.tool, content=c.content or "", tool_call_id=c.call_id) for c in batch.calls]


def requests(state: RunState, topics: Topics, *, redrive: bool = False) -> list[tuple[str, Event]]:
    """The tool requests this state publishes: the calls its transition sends (``ToolBatch.send``), or,
    re-driving a stalled run, every call still waiting for its result."""
    batch = batch_of(state)
    if batch is None:
        return []
    steps = {c.step_id for c in batch.calls if c.runnable} if redrive else set(batch.send)
    return [subagents.request(state, topics, c.step_id, c.tool, c.arguments, batch.asked_by or None)
            for c in batch.calls if c.step_id in steps and c.runnable]


def position(state: RunState, step: str) -> tuple[int, int] | None:
    """(k, n): ``step`` is call k (from 0) of the run's fan-out of n calls; None if it is none of them."""
    batch = batch_of(state)
    if batch is None:
        return None
    for k, call in enumerate(batch.calls):
        if call.step_id == step:
            return k, len(batch.calls)
    return None


def _with(batch: ToolBatch, step: str, *, send: tuple[str, ...], **changes: object) -> ToolBatch:
    calls = tuple(replace(c, **changes) if c.step_id == step else c for c in batch.calls)  # type: ignore[arg-type]
    return ToolBatch(asked_by=batch.asked_by, calls=calls, send=send)


__all__ = ["awaits", "batch_of", "complete", "decided", "plan", "position", "requests", "results", "status",
           "with_result"]
