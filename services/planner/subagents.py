"""Sub-agents and handoffs: an agent's model calls another agent like a tool, or hands the conversation
to one (docs/agents.md, "Sub-agents and handoffs"). Pure functions; no I/O, no clock.

A sub-agent is offered to the model as a tool of its own, ``agent__{name}`` (one argument, ``task``), for
each agent its definition ``calls``; a handoff as ``handoff__{name}`` for each of its ``handoffs``. The
planner resolves both lists to exact versions when the run starts (services/planner/admission.py), so a
run keeps the agents it started with, as it keeps its own.

Why a sub-agent call is a step, and the child a run: the call goes through the machine as any tool call
(one step, its own step id, fanned out with other calls of the same reply, approval rules and limits
included), but instead of a ``ToolCallRequested`` the step publishes the child's ``TaskSubmitted`` on the
intake. The child's run id is derived from the parent's step (``child_run_id``), so a republished request
starts it once: the planner finds the run recorded and changes nothing. The child is an ordinary run in
every other way (its own partition and planner, the same quotas, replay, the chaos suite's guarantees). It
carries its parent (``parent_run_id``, ``parent_step_id``), its depth, and the parent's deadline; when it
ends, its planner publishes, with its outcome, the parent step's result: a ``ToolCallCompleted`` keyed by
the parent run, so it reaches the parent's partition like any tool result, and the parent's fan-in, retries
of the transition and de-duplication need nothing new. A parent that ends first (cancelled, failed, out of
time) asks its running children to stop (``RunCancelRequested``).

A handoff is a transition of the run itself: the model calls ``handoff__{name}``; the planner switches
the run to that definition (its instructions, tools and settings; ``RunState.agent`` records the switch)
and asks the model again with the conversation so far. A session's next turn that names the agent the
conversation was handed from goes to the agent it was handed to (services/planner/sessions.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Final

from agentstream.services.planner.state import COMPLETED, RunState, ToolBatch, ToolRequest
from agentstream.streams.core.agents import Agent, parse_ref
from agentstream.streams.core.events import (
    Event,
    Message,
    RunCancelRequested,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.topics import Topics

AGENT_TOOL: Final = "agent__"
HANDOFF_TOOL: Final = "handoff__"
SERVICE: Final = "planner"


def agent_tool(agent: Agent) -> ToolInfo:
    """How the model sees the sub-agent ``agent``: a tool that takes the task to give it."""
    about = agent.description or f"the {agent.name} agent"
    return ToolInfo(name=AGENT_TOOL + agent.name, description=f"Ask another agent: {about} It answers the task "
                    "you give it, working on its own, and its answer comes back to you.",
                    parameters={"type": "object", "additionalProperties": False, "required": ["task"],
                                "properties": {"task": {"type": "string", "minLength": 1,
                                                        "description": "What the agent should do, in full."}}})


def handoff_tool(agent: Agent) -> ToolInfo:
    """How the model sees a handoff to ``agent``: a tool without arguments."""
    about = agent.description or f"the {agent.name} agent"
    return ToolInfo(name=HANDOFF_TOOL + agent.name, description=f"Hand this conversation over to another agent: "
                    f"{about} It takes over from here and answers the user; you do not answer.",
                    parameters={"type": "object", "additionalProperties": False, "properties": {}})


def is_agent_call(tool: str) -> bool:
    return tool.startswith(AGENT_TOOL)


def is_handoff(tool: str) -> bool:
    return tool.startswith(HANDOFF_TOOL)


def ref_for(refs: Iterable[str], tool: str, prefix: str) -> str | None:
    """The exact agent (``name@version``) behind the tool ``tool`` among ``refs``, or None."""
    name = tool.removeprefix(prefix)
    return next((ref for ref in refs if parse_ref(ref)[0] == name), None)


def child_run_id(parent_step: str) -> str:
    """The child run of the parent's step ``parent_step``: derived from it, so a copy of the request
    names the same run (``run-`` and 16 hex digits, like any run id)."""
    return "run-" + hashlib.sha256(f"child|{parent_step}".encode()).hexdigest()[:16]


def request(state: RunState, topics: Topics, step: str, tool: str, arguments: dict[str, Any],
            asked_by: str | None) -> tuple[str, Event]:
    """What call ``step`` of ``state`` publishes: the child's task for a sub-agent, else the tool request."""
    ref = ref_for(state.subagents, tool, AGENT_TOOL) if is_agent_call(tool) else None
    if ref is None:
        return topics.tool_requests, ToolCallRequested.build(
            run_id=state.run_id, step=step, service=SERVICE, created_at=state.updated_at, parent_step_id=asked_by,
            tool=tool, arguments=json.dumps(arguments, sort_keys=True))
    child = child_run_id(step)
    return topics.tasks, TaskSubmitted.build(
        run_id=child, step=f"{child}:task", service=SERVICE, created_at=state.updated_at, parent_step_id=step,
        task=str(arguments.get("task", "")), agent=ref, max_steps=1, deadline=state.deadline,
        parent_run_id=state.run_id, depth=state.depth + 1, metadata={"parent_run_id": state.run_id})


def result_for_parent(state: RunState) -> ToolCallCompleted | None:
    """The parent step's result once the child run ``state`` has ended (None: not a child, or not ended)."""
    if state.parent_run_id is None or state.parent_step_id is None or not state.terminal:
        return None
    name = parse_ref(state.agent)[0] if state.agent else "agent"
    ok = state.status == COMPLETED
    return ToolCallCompleted.build(
        run_id=state.parent_run_id, step=state.parent_step_id, service=SERVICE, created_at=state.updated_at,
        tool=AGENT_TOOL + name, ok=ok, result=(state.output or state.answer or "") if ok else None,
        error=None if ok else f"the {name} agent's run {state.run_id} failed ({state.error_code}): {state.error}",
        error_kind=None if ok else "tool_error", duration_ms=(state.updated_at - state.submitted_at).total_seconds() * 1000)


def running_children(state: RunState) -> tuple[str, ...]:
    """The child runs ``state`` waits for (its pending sub-agent calls): to be stopped if it ends first."""
    pending = state.pending_request
    calls: list[tuple[str, str]] = []
    if isinstance(pending, ToolRequest) and state.pending_step_id:
        calls.append((state.pending_step_id, pending.tool))
    elif isinstance(pending, ToolBatch):
        calls.extend((c.step_id, c.tool) for c in pending.calls if not c.done)
    return tuple(child_run_id(step) for step, tool in calls if is_agent_call(tool))


def wants_handoff(state: RunState) -> str | None:
    """The agent (exact ref) the run's model just asked to hand the conversation to, or None."""
    request = state.pending_request
    if state.pending_kind != "tool" or not isinstance(request, ToolRequest) or not is_handoff(request.tool):
        return None
    return ref_for(state.handoffs, request.tool, HANDOFF_TOOL)


def handed_over(state: RunState, fresh: RunState) -> RunState:
    """``state`` (its model asked for a handoff: ``wants_handoff``) continued by ``fresh``'s agent: the new
    definition's instructions, tools, settings and team over the conversation so far, with the handoff
    answered; the step the handoff took is given back. ``fresh``: a queued run of the new definition
    (``machine.start``) whose first message is its instructions. The machine asks the model next."""
    request = state.pending_request
    assert isinstance(request, ToolRequest)
    note = Message(role="tool", name=request.tool, content=f"the conversation was handed over to {fresh.agent}",
                   tool_call_id=request.call_id)
    return state.changed(
        agent=fresh.agent, handed_from=state.handed_from or state.agent, tools=fresh.tools,
        approval_tools=fresh.approval_tools, system_prompt=fresh.system_prompt, response_schema=fresh.response_schema,
        native_tools=fresh.native_tools, tool_calling=fresh.tool_calling, sampling=fresh.sampling,
        output_schema=fresh.output_schema, subagents=fresh.subagents, handoffs=fresh.handoffs,
        collection=fresh.collection, messages=(fresh.messages[0], *state.messages[1:], note),
        pending_step_id=None, pending_kind=None, pending_request=None, step_index=state.step_index - 1)


def cancellations(state: RunState, topics: Topics) -> list[tuple[str, Event]]:
    """The stop requests an ended parent sends its running children (``RunState.stop_children``)."""
    return [(topics.tasks, RunCancelRequested.build(
        run_id=child, step=f"{child}:cancel", service=SERVICE, created_at=state.updated_at,
        reason=f"its parent run {state.run_id} ended ({state.error_code or state.status})",
        requested_by=f"parent:{state.run_id}")) for child in state.stop_children]


__all__ = ["AGENT_TOOL", "HANDOFF_TOOL", "agent_tool", "cancellations", "child_run_id", "handed_over", "handoff_tool",
           "is_agent_call", "is_handoff", "ref_for", "request", "result_for_parent", "running_children",
           "wants_handoff"]
