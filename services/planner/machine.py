"""The run state machine, as pure functions: no I/O, no clock (``now`` is passed in).

``start`` makes a run from its task; ``advance`` applies the result of the pending step and decides the
next one; ``prefetched`` takes the speculative retrieval's result; ``decide`` applies a person's
approval or denial; ``cancel`` and ``expire`` end a run early; ``outputs`` is every event a state asks
to be published. Because ``outputs`` depends on the state alone, republishing after a crash yields the same
events (same ids, same bytes) and consumers drop the copies.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timedelta

from agentstream.services.planner import answers, fanout, subagents, summaries, transcript
from agentstream.services.planner.state import (
    AWAITING_APPROVAL,
    COMPLETED,
    FAILED,
    QUEUED,
    RUNNING,
    PendingRequest,
    PrefetchServed,
    RetrievalRequest,
    RunState,
    SummaryRequest,
    ToolBatch,
    ToolRequest,
)
from agentstream.services.planner.transcript import Transcript, Turn
from agentstream.streams.config.generation import GenerationSettings
from agentstream.streams.core import tool_calling as native
from agentstream.streams.core.actions import Action, CallRequest, action_schema, instructions, parse_action
from agentstream.streams.core.errors import ActionError
from agentstream.streams.core.events import (
    ApprovalDecided,
    Event,
    InferenceCompleted,
    InferenceRequested,
    Message,
    RetrievalCompleted,
    RetrievalRequested,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
    ToolCallCompleted,
)
from agentstream.streams.core.ids import step_id
from agentstream.streams.core.kinds import PendingKind, RunStatus
from agentstream.streams.core.structured import load_schema
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.topics import Topics

SERVICE = "planner"
MAX_PARSE_FAILURES = 3
RETRIEVAL_K = 4
RESULT_PREVIEW = 2000  # characters of a tool or retrieval result shown to the model
MAX_ERROR_CHARS = 4000  # of a run's error: it travels in the outcome event, which stays small
#: A retrieval the model asks for is answered by the prefetch when this share of its query's words
#: appear in the task (the prefetch searched for the task text).
PREFETCH_MATCH = 0.6
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def prefetch_step(run_id: str) -> str:
    return f"{run_id}:prefetch"


def start(task: TaskSubmitted, tools: list[ToolInfo], now: datetime, max_run: timedelta | None = None, *,
          max_parallel_calls: int = 1, generation: GenerationSettings | None = None,
          queued: bool = False, tool_calling: str = native.DEFAULT) -> RunState:
    """A new run whose first step asks the model what to do (and, unless the task says not to, a
    retrieval for the task text that starts at the same time). ``max_run``: however long its deadline
    (or without one), the run fails with ``max_duration`` that long after it started.
    ``max_parallel_calls``: the most tool calls one model reply may ask for at once (1: one at a time).
    ``tool_calling``: the planner's default for a task that does not say (``native`` or ``json``,
    streams/core/tool_calling.py).
    ``generation``: the planner's defaults and bounds for what model steps generate (the run keeps the
    settings it starts with); a task's ``output_schema`` shapes the answer in the action schema.
    ``queued``: a turn of a session, which asks nothing until ``begin`` (services/planner/sessions.py)."""
    generation = generation or GenerationSettings()
    schema = load_schema(task.output_schema)
    state = RunState(
        run_id=task.run_id, status=RUNNING, task=task.task, tools=tuple(task.tools),
        max_steps=task.max_steps, deadline=task.deadline, model=task.model,
        expires_at=now + max_run if max_run is not None else None,
        system_prompt=task.system_prompt, step_index=0, pending_step_id=None, pending_kind=None,
        messages=(Message(role="system", content=instructions(tools, task.system_prompt, max_parallel_calls,
                                                              output_schema=schema)),
                  Message(role="user", content=task.task)),
        response_schema=json.dumps(action_schema(tools, max_parallel_calls, output_schema=schema,
                                                 max_answer_chars=generation.max_answer_chars),
                                   separators=(",", ":")),
        sampling=answers.sampling(task, generation), output_schema=task.output_schema,
        output_retries=generation.output_retries,
        max_parallel_calls=max_parallel_calls,
        approval_tools=tuple(t.name for t in tools if t.requires_approval),
        on_tool_error=task.on_tool_error if task.on_tool_error in ("tell_model", "fail_run") else "tell_model",
        prefetch="pending" if task.prefetch else "off", prefetch_sent_at=now if task.prefetch else None,
        replay_of=task.replay_of, version=0, submitted_at=task.created_at, updated_at=now,
    )
    if (task.tool_calling or tool_calling) == "native":
        state = state.changed(
            tool_calling="native", response_schema=None,
            native_tools=json.dumps(native.function_tools(tools), separators=(",", ":")),
            messages=(Message(role="system", content=native.native_instructions(
                tools, task.system_prompt, max_parallel_calls) + answers.native_note(schema)), *state.messages[1:]))
    return state.changed(status=QUEUED, session=task.session) if queued else _ask_model(state, now, [])


def begin(state: RunState, history: Transcript, now: datetime, *, fold: tuple[Turn, ...] = (),
          budget: int = 0) -> RunState:
    """The turn ``state`` (queued) begins, from the session's transcript ``history`` (already within its
    budget): the model sees the earlier turns between the instructions and the turn's task, and the
    transcript is recorded with the run. A session deleted since the turn arrived (its epoch moved on)
    fails the turn with ``session_deleted``. ``fold``: the oldest turns, to be condensed into the
    session's summary first by a model step of the turn (services/planner/summaries.py), after which the
    transcript must fit ``budget``."""
    if history.epoch != state.session_epoch:
        return fail(state, now, "session_deleted", f"the session {state.session!r} was deleted before this turn began")
    state = state.changed(status=RUNNING, prefetch_sent_at=now if state.prefetch == "pending" else None)
    if fold:
        # The summary step comes on top of the task's steps; the turn begins once it is back (``advance``).
        state = state.changed(session_turns=tuple(history.rows()), session_dropped=history.dropped,
                              max_steps=state.max_steps + 1)
        return _next_step(state, now, "model", summaries.request(history.summary, fold, budget), [])
    return _ask_model(_with_transcript(state, history), now, [])


def _with_transcript(state: RunState, history: Transcript) -> RunState:
    """The turn's messages with the session's transcript (its summary in the instructions, then its
    turns) before the task, and the transcript recorded with the run."""
    system, *rest = state.messages
    if system.role == "system" and history.summary:
        system = Message(role="system", content=history.instructions(system.content))
    return state.changed(messages=(system, *history.messages(), *rest),
                         session_turns=tuple(history.rows()), session_dropped=history.dropped)


def _summarised(state: RunState, reply: InferenceCompleted, request: SummaryRequest, now: datetime) -> RunState:
    """The summary step is back: the turn begins from the kept turns and the new summary (the old one if
    the step failed: the folded turns are then only dropped)."""
    usage = {"prompt_tokens": state.prompt_tokens + reply.prompt_tokens,
             "completion_tokens": state.completion_tokens + reply.completion_tokens}
    failed = bool(reply.error) or reply.finish_reason == "error"
    history = summaries.summarised(transcript.started(state), None if failed else reply.text, request.budget)
    return _ask_model(_with_transcript(state.changed(last_step_id=reply.step_id, **usage), history), now, [])


def is_pending_result(state: RunState, event: Event) -> bool:
    """True when ``event`` answers the step the run is waiting for, or one of the calls of its fan-out
    still waiting for a result (anything else is a copy or stale)."""
    if state.status != RUNNING or state.waits_for_prefetch:
        return False
    if state.pending_kind == "tools":
        return isinstance(event, ToolCallCompleted) and fanout.awaits(state, event.step_id)
    return (event.step_id == state.pending_step_id
            and isinstance(event, (InferenceCompleted, ToolCallCompleted, RetrievalCompleted)))


def is_prefetch_result(state: RunState, event: Event) -> bool:
    return (isinstance(event, RetrievalCompleted) and event.step_id == prefetch_step(state.run_id)
            and state.prefetch == "pending" and not state.terminal)


def prefetched(state: RunState, result: RetrievalCompleted, now: datetime) -> RunState:
    """The speculative retrieval came back (check ``is_prefetch_result`` first): keep its passages, or
    answer the retrieval step that was waiting for them."""
    passages = tuple({"id": p.id, "text": p.text, "score": p.score, "source": p.source} for p in result.passages)
    state = state.evolve(prefetch="ready", prefetched=passages, prefetch_error=result.error,
                         prefetch_ready_at=now, updated_at=now)
    request = state.pending_request
    if state.pending_kind == "retrieval" and isinstance(request, RetrievalRequest) and request.prefetch:
        return _serve_from_prefetch(state, now, state.pending_step_id or "", state.step_index - 1,
                                    request.query, waited=True)
    return state


def decide(state: RunState, decision: ApprovalDecided, now: datetime) -> RunState | None:
    """A person's decision on the tool call waiting for approval, or None if it is not waiting for
    this one (a copy, or a decision on a step long gone). In a fan-out, on one of its calls: the
    others run meanwhile."""
    batch = fanout.batch_of(state)
    if batch is not None and not state.terminal:
        decided = fanout.decided(batch, decision.step_id, approved=decision.approved, by=decision.decided_by,
                                 reason=decision.reason)
        if decided is None:
            return None
        if not decision.approved:
            state = state.changed(last_step_id=decision.step_id)
        return _gathered(state, decided, now)
    if state.status != AWAITING_APPROVAL or decision.step_id != state.pending_step_id:
        return None
    request = state.pending_request
    if decision.approved:
        assert isinstance(request, ToolRequest)  # (awaiting approval: a tool call is pending)
        return state.evolve(status=RUNNING, updated_at=now,
                            pending_request=replace(request, approved_by=decision.decided_by))
    tool = request.tool if isinstance(request, ToolRequest) else "the tool"
    note = Message(role="tool", name=tool, content=f"the call to {tool} was denied by a person"
                   + (f": {decision.reason}" if decision.reason else ""),
                   tool_call_id=request.call_id if isinstance(request, ToolRequest) else None)
    return _ask_model(state.changed(last_step_id=decision.step_id, status=RUNNING), now, [note])


def advance(state: RunState, event: InferenceCompleted | ToolCallCompleted | RetrievalCompleted,
            now: datetime) -> RunState:
    """Apply the pending step's result (check ``is_pending_result`` first) and take the next step."""
    if isinstance(event, InferenceCompleted) and isinstance(state.pending_request, SummaryRequest):
        return _summarised(state, event, state.pending_request, now)
    state = state.changed(last_step_id=event.step_id)
    if isinstance(event, InferenceCompleted):
        return _on_model_reply(state, event, now)
    if isinstance(event, ToolCallCompleted):
        if not event.ok and state.on_tool_error == "fail_run" and _gave_up(event):
            return fail(state, now, "tool_failed", f"{event.tool}: {event.error}")
        content = (f"{event.tool} returned: {_preview(event.result)}" if event.ok
                   else f"{event.tool} failed: {event.error}")
        batch = fanout.batch_of(state)
        if batch is not None:
            return _gathered(state, fanout.with_result(batch, event.step_id, content), now)
        request = state.pending_request
        return _ask_model(state, now, [Message(role="tool", name=event.tool, content=content, tool_call_id=(
            request.call_id if isinstance(request, ToolRequest) else None))])
    passages = [{"id": p.id, "text": p.text, "score": p.score, "source": p.source} for p in event.passages]
    return _ask_model(state, now, [_retrieval_message(passages, event.error)])


def _gathered(state: RunState, batch: ToolBatch, now: datetime) -> RunState:
    """The fan-out ``batch`` after a result or a decision: the fan-in (every result to the model, in call
    order) once every call is done, else still waiting (running, or awaiting approval)."""
    if fanout.complete(batch):
        return _ask_model(state.changed(pending_request=batch), now, fanout.results(batch))
    return state.evolve(status=fanout.status(batch), pending_request=batch, updated_at=now)


def _fan_out(state: RunState, now: datetime, calls: tuple[CallRequest, ...], new: list[Message],
             **changes) -> RunState:
    """Several tool calls of one reply, each a step of its own (services/planner/fanout.py)."""
    messages = (*state.messages, *new)
    left = state.max_steps - state.step_index
    if len(calls) > left:
        return fail(state, now, "max_steps", f"the model asked for {len(calls)} tool calls with {left} of the "
                    f"run's {state.max_steps} steps left", messages=messages, **changes)
    batch = fanout.plan(state, calls)
    return state.evolve(status=fanout.status(batch), step_index=state.step_index + len(calls),
                        pending_step_id=step_id(state.run_id, state.step_index, "tools"), pending_kind="tools",
                        pending_request=batch, messages=messages, updated_at=now, **changes)


def _gave_up(event: ToolCallCompleted) -> bool:
    """A failure the tool service will not retry any more (not a bad call the model can correct)."""
    return event.error_kind in ("retries_exhausted", "interrupted") or subagents.is_agent_call(event.tool)


def _retrieval_message(passages: list[dict], error: str | None) -> Message:
    if error:
        content = f"retrieval failed: {error}"
    elif not passages:
        content = "retrieval found no passages."
    else:
        content = "\n".join(f"[{i + 1}] ({p.get('source') or p['id']}) {_preview(p['text'], 600)}"
                            for i, p in enumerate(passages))
    return Message(role="tool", name="retrieve", content=content)


def _serve_from_prefetch(state: RunState, now: datetime, step: str, index: int, query: str,
                         waited: bool) -> RunState:
    """Complete retrieval step ``step`` with the prefetched passages and ask the model again. The time
    saved is what the retrieval had already run when the model asked for it (all of it, if ready)."""
    sent = state.prefetch_sent_at or now
    request = state.pending_request
    asked = request.asked_at if waited and isinstance(request, RetrievalRequest) else None
    asked_at = asked or now
    ready = state.prefetch_ready_at or now
    saved_ms = max(0.0, (min(asked_at, ready) - sent).total_seconds() * 1000)
    served = PrefetchServed(step_id=step, step_index=index, query=query, saved_ms=round(saved_ms, 2),
                            waited=waited)
    state = state.evolve(prefetch="used", prefetch_served=served, last_step_id=step, updated_at=now)
    return _ask_model(state, now, [_retrieval_message(list(state.prefetched), state.prefetch_error)])


def _matches_task(query: str, task: str) -> bool:
    words = {w.lower() for w in _WORD.findall(query)}
    task_words = {w.lower() for w in _WORD.findall(task)}
    return bool(words) and len(words & task_words) / len(words) >= PREFETCH_MATCH


def cancel(state: RunState, now: datetime, reason: str, code: str = "cancelled") -> RunState | None:
    """The cancelled state of a running run, or None if it has already ended. ``code``: ``cancelled``, or
    ``session_deleted`` for a turn whose session was deleted."""
    if state.terminal:
        return None
    return fail(state, now, code, reason or "cancelled on request")


def expire(state: RunState, now: datetime) -> RunState | None:
    """The failed state of a run past its deadline or maximum duration, or None if it still has time
    (or has ended)."""
    if state.terminal:
        return None
    if state.deadline is not None and now >= state.deadline:
        return fail(state, now, "deadline_exceeded",
                    f"the deadline {state.deadline.isoformat()} passed after {state.step_index} steps")
    if state.expires_at is not None and now >= state.expires_at:
        return fail(state, now, "max_duration",
                    f"the run reached its maximum duration ({state.expires_at.isoformat()}) after "
                    f"{state.step_index} steps (AGENTSTREAM_MAX_RUN_S)")
    return None


def _on_model_reply(state: RunState, reply: InferenceCompleted, now: datetime) -> RunState:
    usage = {"prompt_tokens": state.prompt_tokens + reply.prompt_tokens,
             "completion_tokens": state.completion_tokens + reply.completion_tokens}
    if reply.error == "deadline_exceeded":  # the inference service saw the deadline pass first
        return fail(state, now, "deadline_exceeded", "the deadline passed during a model step", **usage)
    if reply.error or reply.finish_reason == "error":
        return fail(state, now, "model_error", reply.error or "the model failed", **usage)
    said = Message(role="assistant", content=reply.text)
    try:
        if state.tool_calling == "native":
            said, action = native.native_action(reply, structured=state.output_schema is not None)
        else:
            action = parse_action(reply.text, structured=state.output_schema is not None)
        if len(action.calls) > state.max_parallel_calls:
            raise ActionError(f"{len(action.calls)} tool calls in one reply; at most {state.max_parallel_calls} "
                              "at once" if state.max_parallel_calls > 1 else "one tool call per reply")
    except ActionError as exc:
        failures = state.parse_failures + 1
        if failures >= MAX_PARSE_FAILURES:
            return fail(state, now, "unparseable_model_output",
                         f"{failures} replies in a row were not valid actions; last: {exc}",
                         parse_failures=failures, **usage)
        hint = Message(role="user", content=f"That reply was not a valid action ({exc}). "
                                            + ("Call a tool, or answer in plain text." if state.tool_calling == "native"
                                               else "Reply with exactly one JSON object as described."))
        # (a native reply's calls are not kept: each call would need its own answer)
        said = Message(role="assistant", content=said.content or json.dumps(
            [{"name": c.name, "arguments": c.arguments} for c in said.tool_calls]))
        return _ask_model(state, now, [said, hint], parse_failures=failures, **usage)
    if action.kind == "final_answer":
        output = None
        if state.output_schema is not None:
            checked = answers.check(state, action.value)
            if checked.output is None:
                return _invalid_output(state, now, said, checked.problem or "invalid", **usage)
            output = checked.output
        return state.evolve(status=COMPLETED, answer=output or action.answer, output=output, pending_step_id=None,
                            pending_kind=None, pending_request=None, messages=(*state.messages, said),
                            parse_failures=0, updated_at=now, **usage)
    refused = [c.tool for c in action.calls if c.tool not in state.tools]
    if action.kind == "tool" and action.tool not in state.tools:
        refused = [action.tool or ""]
    if refused:
        allowed = ", ".join(state.tools) or "none"
        names = ", ".join(repr(t) for t in refused)
        note = (f"tool {names} is not available for this task (available: {allowed})"
                + ("; none of the calls was made" if action.kind == "tools" else ""))
        # Native calls are answered each by id (the engines' templates expect one answer per call).
        notes = ([Message(role="tool", name=c.tool, content=note, tool_call_id=c.call_id) for c in action.calls]
                 if said.tool_calls else [Message(role="tool", name=refused[0], content=note)])
        return _ask_model(state, now, [said, *notes], parse_failures=0, **usage)
    if action.kind == "tools":
        return _fan_out(state, now, action.calls, [said], parse_failures=0, **usage)
    return _request(state, now, action, [said], parse_failures=0, **usage)


def _invalid_output(state: RunState, now: datetime, said: Message, problem: str, **usage: int) -> RunState:
    """A final answer that does not match the output schema: back to the model with the reason, or, once
    the run's retries are spent, the end of the run (``invalid_output``)."""
    failures = state.output_failures + 1
    if failures > state.output_retries:
        return fail(state, now, "invalid_output",
                    f"{failures} answers did not match the output schema; last: {problem}",
                    messages=(*state.messages, said), output_failures=failures, parse_failures=0, **usage)
    return _ask_model(state, now, [said, answers.retry_message(problem)], output_failures=failures,
                      parse_failures=0, **usage)


def _ask_model(state: RunState, now: datetime, new: list[Message], **changes) -> RunState:
    return _next_step(state, now, "model", None, new, **changes)


def ask(state: RunState, now: datetime) -> RunState:
    """The run's next step asks the model (after a handoff: services/planner/subagents.py)."""
    return _ask_model(state, now, [])


def _request(state: RunState, now: datetime, action: Action, new: list[Message], **changes) -> RunState:
    if action.kind == "tool":
        request = ToolRequest(tool=action.tool or "", arguments=action.arguments,
                              call_id=native.call_id_of(action))
        status: RunStatus = AWAITING_APPROVAL if action.tool in state.approval_tools else RUNNING
        return _next_step(state, now, "tool", request, new, status=status, **changes)
    query = action.query or ""
    if state.prefetch in ("pending", "ready") and _matches_task(query, state.task):
        # The speculative retrieval searched for this already: use it, or wait for it.
        if state.prefetch == "ready":
            state = _next_step(state, now, "retrieval", RetrievalRequest(query=query, k=RETRIEVAL_K, prefetch=True),
                               new, **changes)
            if state.terminal:
                return state
            return _serve_from_prefetch(state, now, state.pending_step_id or "", state.step_index - 1, query,
                                        waited=False)
        return _next_step(state, now, "retrieval",
                          RetrievalRequest(query=query, k=RETRIEVAL_K, prefetch=True, asked_at=now),
                          new, **changes)
    return _next_step(state, now, "retrieval", RetrievalRequest(query=query, k=RETRIEVAL_K), new, **changes)


def _next_step(state: RunState, now: datetime, kind: PendingKind, request: PendingRequest, new: list[Message],
               status: RunStatus = RUNNING, **changes) -> RunState:
    messages = (*state.messages, *new)
    if state.step_index >= state.max_steps:
        return fail(state, now, "max_steps", f"the run used all {state.max_steps} steps without an answer",
                    messages=messages, **changes)
    return state.evolve(
        status=status, step_index=state.step_index + 1,
        pending_step_id=step_id(state.run_id, state.step_index, kind), pending_kind=kind,
        pending_request=request, messages=messages, updated_at=now, **changes,
    )


def fail(state: RunState, now: datetime, code: str, reason: str, **changes) -> RunState:
    """The run ended without an answer: ``code`` is machine-readable, ``reason`` is for people."""
    return state.evolve(status=FAILED, error_code=code, error=_preview(reason, MAX_ERROR_CHARS), pending_step_id=None,
                        pending_kind=None, pending_request=None, stop_children=subagents.running_children(state),
                        updated_at=now, **changes)


def _preview(text: str | None, limit: int = RESULT_PREVIEW) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def outputs(state: RunState, topics: Topics, *, snapshot: bool = True, redrive: bool = False) -> list[tuple[str, Event]]:
    """Every event this state asks to be published, in order: the pending request (or the outcome)
    and, unless held back (services/planner/snapshots.py), the snapshot. Of a fan-out, the calls its
    transition sends; ``redrive`` (the sweeper, for a run that stalled): every call still to answer."""
    out: list[tuple[str, Event]] = []
    common: dict = {"run_id": state.run_id, "service": SERVICE, "created_at": state.updated_at}
    if state.prefetch == "pending" and state.last_step_id is None and state.step_index == 1:
        # Only the run's first state asks for the prefetch, so republishing later states never repeats it.
        out.append((topics.retrieval_requests, RetrievalRequested.build(
            step=prefetch_step(state.run_id), query=state.task[:1000], k=RETRIEVAL_K, collection=state.collection or "default", **common)))
    if state.status == RUNNING and state.pending_step_id and not state.waits_for_prefetch:
        step = state.pending_step_id
        request = state.pending_request
        common["parent_step_id"] = state.last_step_id
        if isinstance(request, SummaryRequest):
            out.append((topics.inference_requests, InferenceRequested.build(
                step=step, messages=list(request.prompt), model=state.model, max_tokens=request.max_tokens,
                temperature=0.0, seed=state.sampling.seed, deadline=state.deadline, **common)))
        elif state.pending_kind == "model":
            out.append((topics.inference_requests, InferenceRequested.build(
                step=step, messages=list(state.messages), model=state.model,
                response_schema=state.response_schema, max_tokens=state.sampling.max_tokens,
                temperature=state.sampling.temperature, top_p=state.sampling.top_p, stop=list(state.sampling.stop),
                seed=state.sampling.seed, deadline=state.deadline, tools=state.native_tools, session=state.session,
                **common)))
        elif state.pending_kind == "tools":
            out.extend(fanout.requests(state, topics, redrive=redrive))
        elif state.pending_kind == "tool":
            assert isinstance(request, ToolRequest), request
            out.append(subagents.request(state, topics, step, request.tool, request.arguments, state.last_step_id))
        else:
            assert isinstance(request, RetrievalRequest), request
            out.append((topics.retrieval_requests, RetrievalRequested.build(
                step=step, query=request.query, k=request.k, collection=state.collection or "default", **common)))
    elif state.status == COMPLETED:
        out.append((topics.outcomes, RunCompleted.build(
            step=f"{state.run_id}:outcome", answer=state.answer or "", steps=state.step_index,
            duration_ms=_ms(state.submitted_at, state.updated_at), prompt_tokens=state.prompt_tokens,
            completion_tokens=state.completion_tokens, output=state.output, **common)))
    elif state.status == FAILED:
        out.append((topics.outcomes, RunFailed.build(
            step=f"{state.run_id}:outcome", error_code=state.error_code or "failed", error=state.error or "",
            steps=state.step_index, duration_ms=_ms(state.submitted_at, state.updated_at), **common)))
    if state.terminal:
        to_parent = subagents.result_for_parent(state)  # a sub-agent's run: its outcome is the parent's result
        out.extend([(topics.tool_results, to_parent)] if to_parent is not None else [])
        out.extend(subagents.cancellations(state, topics))
    if state.session is not None and state.status == COMPLETED:
        updated = transcript.event(state, SERVICE)  # the session's mirror (keyed by session: publishing.py)
        if updated is not None:
            out.append((topics.sessions, updated))
    if snapshot:
        out.append((topics.runs, state.snapshot(service=SERVICE)))
    return out


def _ms(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000
