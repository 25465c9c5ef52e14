"""Tasks that name an agent (``TaskSubmitted.agent``): resolved when the task is admitted.

The planner resolves the reference against the agent catalogue (``agent.agents``; a bare name is the
agent's latest version at that moment, ``name@version`` that version) and the run starts as if its task
had carried the definition's fields: tools, model, system prompt, output schema, generation settings,
tool calling, prefetch, ``on_tool_error`` and ``max_steps`` (``apply``). The task adds its text,
metadata, session and deadline; the definition's ``deadline_s`` (from the run's admission) applies too,
whichever ends first. The run records the exact definition (``RunState.agent``, ``name@version``) and
the definition's retrieval collection (``RunState.collection``), so a later version of the agent does
not change a run that started with an earlier one, and the record says which it was.

Refused with ``invalid_task`` (the reason names what exists): a malformed reference, an unknown agent or
version, a task that also sets a field the definition decides (streams/core/agents.py,
``task_override_problem``). After resolution the ordinary task rules apply to the resolved task (the
definition's tools must still be registered, its ``max_tokens`` within this pipeline's bound).

The agents a definition ``calls`` and ``handoffs`` are resolved with it, to exact versions, and offered to
the model as tools (``team``: ``agent__{name}``, ``handoff__{name}``; services/planner/subagents.py). A run
at ``AGENTSTREAM_MAX_AGENT_DEPTH`` is not offered the agents it could call (it may still hand over); a
task deeper than that is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from agentstream.streams.catalog.agents import AgentCatalog
from agentstream.streams.core.agents import Agent, ref_problem, task_override_problem
from agentstream.streams.core.errors import AgentRejected
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.core.tools import ToolInfo


async def admit(task: TaskSubmitted, catalog: AgentCatalog, now: datetime) -> tuple[TaskSubmitted, Agent | None, str | None]:
    """``(the task the run starts from, the definition, None)`` for a task naming an agent it may use, or
    ``(task, None, why not)``; a task naming none is returned as it is. Raises ``AgentCatalogUnavailable``
    while the catalogue cannot be read (the planner waits the broker's outage out)."""
    if task.agent is None:
        return task, None, None
    problem = ref_problem(task.agent) or task_override_problem(task.agent, overrides(task))
    if problem is not None:
        return task, None, problem
    try:
        agent = await catalog.resolve(task.agent)
    except AgentRejected as exc:
        return task, None, str(exc)
    return apply(task, agent, now), agent, None


@dataclass(frozen=True)
class Team:
    """The agents a run may call and hand over to (exact refs) and the tools that offer them to its model."""

    calls: tuple[str, ...] = ()
    handoffs: tuple[str, ...] = ()
    tools: list[ToolInfo] = field(default_factory=list)

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]


async def team(agent: Agent, catalog: AgentCatalog, *, depth: int, max_depth: int) -> tuple[Team, str | None]:
    """``agent``'s sub-agents and handoffs, resolved now (``(Team(), why not)`` when one is gone, or the run
    is deeper than ``max_depth``)."""
    from agentstream.services.planner import (
        subagents,  # (subagents imports the run's state, as this need not)
    )

    if depth > max_depth:
        return Team(), (f"the sub-agent tree is {depth} deep, deeper than AGENTSTREAM_MAX_AGENT_DEPTH={max_depth}: "
                        "a definition that calls agents which call agents in turn stops there")
    try:
        called = [await catalog.resolve(ref) for ref in agent.calls] if depth < max_depth else []
        handed = [await catalog.resolve(ref) for ref in agent.handoffs]
    except AgentRejected as exc:
        return Team(), f"agent {agent.ref}: {exc}"
    tools = [*(subagents.agent_tool(a) for a in called), *(subagents.handoff_tool(a) for a in handed)]
    return Team(calls=tuple(a.ref for a in called), handoffs=tuple(a.ref for a in handed), tools=tools), None


def overrides(task: TaskSubmitted) -> dict[str, Any]:
    """The task's fields that a definition decides (``DECIDED``), as the task carries them."""
    return {"tools": task.tools, "model": task.model, "system_prompt": task.system_prompt,
            "output_schema": task.output_schema, "max_tokens": task.max_tokens, "temperature": task.temperature,
            "top_p": task.top_p, "stop": task.stop, "seed": task.seed, "tool_calling": task.tool_calling,
            "prefetch": task.prefetch, "on_tool_error": task.on_tool_error}


def apply(task: TaskSubmitted, agent: Agent, now: datetime) -> TaskSubmitted:
    """``task`` with the definition's fields: what the run starts from (its id, text, metadata and session
    are the task's; its deadline the earlier of the task's and ``now`` plus the definition's ``deadline_s``)."""
    deadline = task.deadline
    if agent.deadline_s is not None:
        limit = now + timedelta(seconds=agent.deadline_s)
        deadline = limit if deadline is None else min(deadline, limit)
    return replace(task, tools=list(agent.tools), max_steps=agent.max_steps, deadline=deadline, model=agent.model,
                   system_prompt=agent.system_prompt, prefetch=agent.prefetch, on_tool_error=agent.on_tool_error,
                   output_schema=agent.schema_text, max_tokens=agent.max_tokens, temperature=agent.temperature,
                   top_p=agent.top_p, stop=list(agent.stop), seed=agent.seed, tool_calling=agent.tool_calling)


__all__ = ["Team", "admit", "apply", "overrides", "team"]
