"""An in-memory stand-in for the PostgreSQL pool the tool service records its calls with.

The tool service checks every call against its run's record and claims it in one statement
(streams/store/tool_calls.py), then records the outcome (services/tools/service.py). ``InMemoryDatabase``
answers exactly those statements from Python dictionaries — the planner's run rows (``runs.state``, the
keys the check reads), the ``tool_calls`` rows and the steps a run recorded as done — so the service's
logic runs unchanged without a database. It is a model of those statements, kept beside them: any other
statement raises ``NotImplementedError`` naming it, unless a test answers it (``on``). The statements
themselves are tested against PostgreSQL (tests/integration).

``down = True`` turns every statement into a refused connection: a database outage, as
``agentstream.streams.core.outages`` classifies it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentstream.streams.core.events import ToolCallRequested
from agentstream.streams.store import tool_calls

#: SQL NULL, where JSON ``null`` is a value: arguments that were not JSON.
_NULL: Any = object()

_ATTEMPTS = "UPDATE tool_calls SET attempts = $2 WHERE step_id = $1"
_FINISH = "UPDATE tool_calls SET status = $2, result = $3::jsonb, error = $4, error_kind = $5, attempts = $6,"


@dataclass
class RunRow:
    """A run's row of ``runs``: its status and the planner's state (``runs.state``) as JSON data."""

    run_id: str
    status: str = "running"
    error_code: str | None = None
    state: dict[str, Any] | None = None


@dataclass
class ToolCallRow:
    """A row of ``tool_calls``: ``running`` once claimed, ``succeeded`` or ``failed`` once finished."""

    step_id: str
    run_id: str
    tool: str
    arguments: Any
    status: str = "running"
    result: Any = None
    error: str | None = None
    error_kind: str | None = None
    attempts: int = 1


@dataclass
class InMemoryDatabase:
    """The tables the tool service reads and writes, in memory, behind the pool methods it calls."""

    runs: dict[str, RunRow] = field(default_factory=dict)
    tool_calls: dict[str, ToolCallRow] = field(default_factory=dict)
    #: Steps their runs recorded as done: step id -> (run id, tool, arguments).
    steps: dict[str, tuple[str, str, Any]] = field(default_factory=dict)
    #: Steps their runs requested (``expect``): step id -> (run id, tool, arguments).
    requested: dict[str, tuple[str, str, Any]] = field(default_factory=dict)
    #: While set, every statement fails as a refused connection (an outage).
    down: bool = False
    #: Every statement run, in order: (the statement, whitespace folded; its arguments).
    statements: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    _answers: list[tuple[str, Callable[..., Any]]] = field(default_factory=list)

    # -- what a test sets up -----------------------------------------------------------------------
    def expect(self, call: ToolCallRequested, *, tools: Iterable[str] | None = None,
               approval_tools: Iterable[str] = (), approved_by: str | None = None, status: str = "running",
               topic_prefix: str = "") -> RunRow:
        """Record ``call``'s run as the planner does before it publishes the call: a run whose pending step
        is this tool call, with these arguments (approved by ``approved_by``, if given)."""
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            arguments = call.arguments
        request: dict[str, Any] = {"tool": call.tool, "arguments": arguments}
        self.requested[call.step_id] = (call.run_id, call.tool, arguments)
        if approved_by is not None:
            request["approved_by"] = approved_by
        run = self.runs[call.run_id] = RunRow(call.run_id, status, state={
            "topic_prefix": topic_prefix, "tools": list(tools if tools is not None else [call.tool]),
            "approval_tools": list(approval_tools), "pending_step_id": call.step_id, "pending_kind": "tool",
            "pending_request": request})
        return run

    def expect_fanout(self, calls: Iterable[ToolCallRequested], *, awaiting: Iterable[str] = (),
                      done: Iterable[str] = (), tools: Iterable[str] | None = None,
                      approval_tools: Iterable[str] = (), topic_prefix: str = "") -> RunRow:
        """Record ``calls`` (of one run) as the planner records a fan-out before it publishes it: the
        run's pending step is the batch (services/planner/fanout.py); the step ids in ``awaiting`` wait
        for a person, those in ``done`` were answered."""
        calls = list(calls)
        waiting, answered = set(awaiting), set(done)
        entries = []
        for call in calls:
            entry: dict[str, Any] = {"step_id": call.step_id, "tool": call.tool, "arguments": json.loads(call.arguments)}
            if call.step_id in waiting:
                entry["awaiting_approval"] = True
            if call.step_id in answered:
                entry["done"] = True
            entries.append(entry)
        run_id = calls[0].run_id
        run = self.runs[run_id] = RunRow(run_id, "running", state={
            "topic_prefix": topic_prefix, "tools": list(tools if tools is not None else {c.tool for c in calls}),
            "approval_tools": list(approval_tools), "pending_step_id": f"{calls[0].step_id}s",
            "pending_kind": "tools", "pending_request": {"asked_by": "", "calls": entries, "send": []}})
        return run

    def step_done(self, call: ToolCallRequested) -> None:
        """The run applied an answer to ``call``'s step and moved on (no pending step now)."""
        self.steps[call.step_id] = (call.run_id, call.tool, json.loads(call.arguments))
        run = self.runs.get(call.run_id)
        if run is not None and run.state is not None:
            run.state.update(pending_step_id=None, pending_kind=None, pending_request=None)

    def on(self, statement: str, answer: Callable[..., Any]) -> None:
        """Answer statements that start with ``statement`` (whitespace folded) with ``answer(*args)``:
        for tools of one's own that use ``ToolContext.pool``."""
        self._answers.append((_fold(statement), answer))

    # -- the pool ----------------------------------------------------------------------------------
    async def fetchrow(self, statement: str, *args: Any) -> dict[str, Any] | None:
        result = self._run(statement, args)
        return dict(result) if isinstance(result, dict) else result

    async def fetchval(self, statement: str, *args: Any) -> Any:
        return self._run(statement, args)

    async def fetch(self, statement: str, *args: Any) -> list[Any]:
        return list(self._run(statement, args) or [])

    async def execute(self, statement: str, *args: Any) -> str:
        result = self._run(statement, args)
        return result if isinstance(result, str) else "OK"

    def _run(self, statement: str, args: tuple[Any, ...]) -> Any:
        folded = _fold(statement)
        self.statements.append((folded, args))
        if self.down:
            raise ConnectionRefusedError(111, "the in-memory database is down")
        if statement == tool_calls._CLAIM:
            return self._claim(*args)
        if statement == tool_calls._EARLIER:
            row = self.tool_calls.get(args[0])
            return None if row is None else _earlier(row, _json(args[1]))
        if statement == tool_calls._ANSWERED:
            step_id, run_id, tool, arguments, or_requested = args
            found = (run_id, tool, json.loads(arguments))
            return self.steps.get(step_id) == found or (or_requested and self.requested.get(step_id) == found)
        if folded == "SELECT 1":
            return 1
        if folded.startswith(_ATTEMPTS):
            self.tool_calls[args[0]].attempts = args[1]
            return "UPDATE 1"
        if folded.startswith(_FINISH):
            step_id, status, result, error, error_kind, attempts = args
            row = self.tool_calls[step_id]
            row.status, row.error, row.error_kind, row.attempts = status, error, error_kind, attempts
            row.result = None if result is None else json.loads(result)
            return "UPDATE 1"
        for prefix, answer in self._answers:
            if folded.startswith(prefix):
                return answer(*args)
        raise NotImplementedError(f"InMemoryDatabase does not answer {folded[:200]!r}: answer it with "
                                  "InMemoryDatabase.on(...), or test against PostgreSQL (agentstream.testing.Pipeline)")

    def _claim(self, step_id: str, run_id: str, tool: str, arguments_json: str | None, prefix: str,
               requires_approval: bool, execute: bool) -> dict[str, Any]:
        """``tool_calls._CLAIM``: the verdict on the run's record, the claim, and the step's earlier row."""
        arguments = _json(arguments_json)
        run = self.runs.get(run_id)
        state = run.state if run is not None else None
        refusal = _verdict(run, step_id, tool, arguments, prefix, requires_approval)
        before = self.tool_calls.get(step_id)
        claimed = refusal is None and execute and before is None
        if claimed:
            self.tool_calls[step_id] = ToolCallRow(step_id, run_id, tool, None if arguments is _NULL else arguments)
        row = {"refusal": refusal, "run_status": run.status if run is not None else None,
               "run_error_code": run.error_code if run is not None else None,
               "pending_step": state.get("pending_step_id") if state is not None else None, "claimed": claimed}
        if before is None:
            return {**row, **dict.fromkeys(("prev_run_id", "prev_tool", "prev_same_arguments", "prev_status",
                                            "prev_result", "prev_error", "prev_error_kind", "prev_attempts"))}
        return {**row, **_earlier(before, arguments)}


def _verdict(run: RunRow | None, step_id: str, tool: str, arguments: Any, prefix: str,
             requires_approval: bool) -> str | None:
    """The ``CASE`` of ``tool_calls._CLAIM``, in its order."""
    state = run.state if run is not None else None
    if run is None or state is None:
        return "unknown_run"
    if (state.get("topic_prefix") or "") != prefix:
        return "other_pipeline"
    if run.status in ("completed", "failed"):
        return "run_finished"
    if tool not in (state.get("tools") or ()):
        return "tool_not_allowed"
    request = _pending_call(state, step_id)
    if request is None or "done" in request:
        return "not_pending"
    if "awaiting_approval" in request or (run.status == "awaiting_approval" and state.get("pending_kind") == "tool"):
        return "awaiting_approval"
    if request.get("tool") != tool or request.get("arguments", _NULL) != arguments:
        return "not_as_requested"
    if "approved_by" in request:
        return None
    if tool in (state.get("approval_tools") or ()):
        return "not_approved"
    return "approval_required" if requires_approval else None


def _pending_call(state: dict[str, Any], step_id: str) -> dict[str, Any] | None:
    """The run's pending call with this step id: its one pending tool call, or a call of its fan-out."""
    request = state.get("pending_request") or {}
    if state.get("pending_kind") == "tools":
        return next((c for c in request.get("calls", ()) if c.get("step_id") == step_id), None)
    if state.get("pending_kind") == "tool" and state.get("pending_step_id") == step_id:
        return request
    return None


def _earlier(row: ToolCallRow, arguments: Any) -> dict[str, Any]:
    same = None if arguments is _NULL or row.arguments is None else row.arguments == arguments
    return {"prev_run_id": row.run_id, "prev_tool": row.tool, "prev_same_arguments": same,
            "prev_status": row.status, "prev_result": None if row.result is None else json.dumps(row.result),
            "prev_error": row.error, "prev_error_kind": row.error_kind, "prev_attempts": row.attempts}


def _json(text: str | None) -> Any:
    return _NULL if text is None else json.loads(text)


def _fold(statement: str) -> str:
    return " ".join(statement.split())


__all__ = ["InMemoryDatabase", "RunRow", "ToolCallRow"]
