"""Admission: whether a task becomes a run that works or one that fails at once, and the quotas that
limit a pipeline's runs (``Settings.quotas``: a tenant's cell).

A task is refused (``invalid_task``) when it breaks the rules ``submit`` applies (streams/core/task_rules.py:
the same rules guard against tasks published by other means) or names tools the catalogue does not know,
when it names an agent (or version) the agent catalogue does not know (services/planner/agents.py: a task
naming a known one runs with the definition's fields), and when its run id is taken by another pipeline's
run. A task over a quota fails with ``quota_exceeded``; so does a run whose tokens pass ``tokens_per_run``.
Budgets over time (``tokens_per_hour``, ``tokens_per_day``, ``tasks_per_second``) are counted in PostgreSQL,
shared by the cell's planners (streams/store/budgets.py): a task is charged at admission once its
``max_steps`` is within the quota (and refused when it is one too many for its second, or when a token
budget is used up), a model step's tokens when its result arrives (the run fails when nothing is left);
each charge is keyed by the task's run or the step, so a redelivery is not counted twice. Cells without
them make no extra query.
A refused task is still recorded and answered with a ``RunFailed``: its producer is waiting for an outcome.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from agentstream.services.planner import agents, machine, subagents
from agentstream.services.planner.state import TERMINAL, RunState
from agentstream.streams.catalog.agents import AgentCatalog
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.config.quotas import Quotas
from agentstream.streams.core import task_rules, tool_calling
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.store.budgets import Budget, BudgetLedger, Charge, Ledger, Use
from agentstream.streams.store.history import TransitionStore
from agentstream.streams.telemetry import stages


class Admission:
    """Decides a task's first state; ``max_run``: how long any run may last after it started. ``agents``: the
    agent catalogue (default: the runtime's ``agent.agents``, read only when a task names an agent)."""

    def __init__(self, runtime: Runtime, store: TransitionStore, tools: ToolCatalog, max_run: timedelta, *,
                 agents: AgentCatalog | None = None) -> None:
        self.runtime = runtime
        self.store = store
        self.tools = tools
        self.agents = agents or AgentCatalog.for_runtime(runtime)
        self.max_run = max_run
        #: The cell's counters of budgets over time (made at first use; a test may give its own).
        self.ledger: Ledger | None = None

    async def start(self, task: TaskSubmitted, now: datetime, *, queued: bool = False) -> RunState:
        """The run ``task`` starts: asking the model, or failed (``invalid_task``, ``quota_exceeded``,
        ``deadline_exceeded`` for a deadline already past). ``queued``: a turn of a session, which waits
        for its turn instead of asking the model (services/planner/sessions.py)."""
        checking = time.perf_counter()
        task, agent, problem = await agents.admit(task, self.agents, now)  # a named agent: its definition's fields
        problem = problem or await self.task_problem(task, now)
        tools = await self.tools.describe(task.tools) if problem is None else []
        team = agents.Team()
        if agent is not None and problem is None:  # the agents it may call and hand over to, as tools
            team, problem = await agents.team(agent, self.agents, depth=task.depth,
                                              max_depth=self.runtime.settings.max_agent_depth)
            task, tools = replace(task, tools=[*task.tools, *team.tool_names]), [*tools, *team.tools]
        if (clock := stages.clock()) is not None:
            clock.since("planner.task_checks", checking)
        state = machine.start(task, tools, now, self.max_run,
                              max_parallel_calls=self.runtime.settings.max_parallel_tool_calls,
                              generation=self.runtime.settings.generation, queued=queued,
                              tool_calling=self.runtime.settings.tool_calling)
        if agent is not None:  # the exact definition the run uses, where its retrievals search, its team
            state = state.changed(agent=agent.ref, collection=agent.collection, subagents=team.calls,
                                  handoffs=team.handoffs)
        if task.parent_run_id is not None:  # a sub-agent's run (services/planner/subagents.py)
            state = state.changed(parent_run_id=task.parent_run_id, parent_step_id=task.parent_step_id,
                                  depth=task.depth)
        over = await self.over_quota(task, now) if problem is None else None
        if problem is not None:
            state = machine.fail(state, now, "invalid_task", problem)
        elif over is not None:
            state = machine.fail(state, now, "quota_exceeded", over)
        elif task.deadline is not None and task.deadline <= now:
            state = machine.expire(state, now) or state
        return state

    async def hand_off(self, state: RunState, ref: str, now: datetime) -> RunState:
        """The run ``state`` continued by the agent ``ref`` its model handed the conversation to: that
        definition's instructions, tools, settings and team (resolved as a task naming it would be), the
        run's own id, task, deadline, steps and conversation (services/planner/subagents.py)."""
        agent = await self.agents.resolve(ref)
        task = agents.apply(TaskSubmitted.build(run_id=state.run_id, step=f"{state.run_id}:task", service="planner",
                                                task=state.task, max_steps=state.max_steps, deadline=state.deadline,
                                                session=state.session), agent, now)
        team, problem = await agents.team(agent, self.agents, depth=state.depth,
                                          max_depth=self.runtime.settings.max_agent_depth)
        if problem is not None:
            return machine.fail(state, now, "invalid_task", f"the handoff to {ref} failed: {problem}")
        task = replace(task, tools=[*task.tools, *team.tool_names], deadline=state.deadline)
        fresh = machine.start(task, [*await self.tools.describe(task.tools[:len(agent.tools)]), *team.tools], now,
                              max_parallel_calls=self.runtime.settings.max_parallel_tool_calls,
                              generation=self.runtime.settings.generation, queued=True,
                              tool_calling=self.runtime.settings.tool_calling)
        fresh = fresh.changed(agent=agent.ref, collection=agent.collection, subagents=team.calls, handoffs=team.handoffs)
        return machine.ask(subagents.handed_over(state, fresh), now)

    def taken(self, task: TaskSubmitted, now: datetime) -> RunState:
        """The failed state that answers ``task`` when its run id belongs to another pipeline's run (not
        recorded: the row is the other pipeline's)."""
        return machine.fail(machine.start(task, [], now, self.max_run), now, "invalid_task",
                            f"the run id {task.run_id!r} is taken by a run of another cell; submit under "
                            "another run id")

    async def task_problem(self, task: TaskSubmitted, now: datetime) -> str | None:
        """Submit refuses bad tasks; the same rules (streams/core/task_rules.py) guard against tasks published
        by other means. A deadline that passed is not a problem of the task: the run fails as late."""
        problem = (task_rules.event_id_problem(task.event_id)
                   or task_rules.task_problem(task=task.task, tools=task.tools, max_steps=task.max_steps,
                                              deadline=None, model=task.model, system_prompt=task.system_prompt,
                                              metadata=task.metadata, on_tool_error=task.on_tool_error,
                                              prefetch=task.prefetch, now=now)
                   or task_rules.generation_problem(
                       output_schema=task.output_schema, max_tokens=task.max_tokens, temperature=task.temperature,
                       top_p=task.top_p, stop=task.stop, seed=task.seed,
                       max_tokens_limit=self.runtime.settings.generation.max_tokens_limit)
                   or tool_calling.problem(task.tool_calling))
        if problem:
            return problem
        unknown = await self.tools.unknown(task.tools)
        if unknown:
            return f"unknown tools: {', '.join(unknown)}"
        return None

    async def over_quota(self, task: TaskSubmitted, now: datetime) -> str | None:
        """Why this pipeline's quotas refuse ``task`` (``Settings.quotas``), or None. A task that asks for
        no more steps than allowed is a submission (charged to ``tasks_per_second`` once per run id, in the
        same round trip that reads the token budgets' use), whatever refuses it next."""
        quotas = self.runtime.settings.quotas
        if quotas.max_steps is not None and task.max_steps > quotas.max_steps:
            return f"max_steps {task.max_steps} is over the quota of {quotas.max_steps}"
        uses = await self.budgets(task, now)
        if uses and uses[0].budget is Budget.TASKS_PER_SECOND and uses[0].over:
            return uses[0].reason()
        if quotas.runs_in_flight is not None:
            active = await self.store.active_count(self.runtime.topics.prefix)
            if active >= quotas.runs_in_flight:
                return f"{active} runs are in flight, the quota is {quotas.runs_in_flight}"
        for use in uses:
            if use.budget is not Budget.TASKS_PER_SECOND and use.exhausted:
                return use.reason()
        return None

    async def budgets(self, task: TaskSubmitted, now: datetime) -> list[Use]:
        """``task`` charged to ``tasks_per_second`` (first), and the token budgets' use; [] without them."""
        quotas = self.runtime.settings.quotas
        charges = _token_charges(quotas, 0)
        if quotas.tasks_per_second is not None:
            charges.insert(0, Charge(Budget.TASKS_PER_SECOND, 1, quotas.tasks_per_second))
        if not charges:
            return []
        key = f"{task.run_id}:task" if quotas.tasks_per_second is not None else None
        return await self._ledger().charge(key, now, charges)

    async def charge_tokens(self, before: RunState, state: RunState, step_id: str) -> RunState:
        """``state`` after the step ``step_id`` (``before``: the state it advanced from), failed with
        ``quota_exceeded`` if the run's tokens are now over the pipeline's ``tokens_per_run``, or the
        cell's tokens per hour or per day, to which the step's tokens are charged, are used up."""
        quotas = self.runtime.settings.quotas
        limit = quotas.tokens_per_run
        used = state.prompt_tokens + state.completion_tokens
        if limit is not None and state.status not in TERMINAL and used > limit:
            state = machine.fail(state, datetime.now(UTC), "quota_exceeded",
                                 f"the run used {used} tokens, over the quota of {limit} per run")
        spent = used - before.prompt_tokens - before.completion_tokens
        if not quotas.token_budgets or spent <= 0:
            return state
        now = datetime.now(UTC)
        for use in await self._ledger().charge(step_id, now, _token_charges(quotas, spent)):
            if use.exhausted and state.status not in TERMINAL:
                return machine.fail(state, now, "quota_exceeded", use.reason())
        return state

    def _ledger(self) -> Ledger:
        if self.ledger is None:
            self.ledger = BudgetLedger(self.store.pool, self.runtime.topics.prefix)
        return self.ledger


def _token_charges(quotas: Quotas, amount: int) -> list[Charge]:
    """``amount`` tokens charged to each token budget ``quotas`` sets (0: their use read)."""
    return [Charge(budget, amount, limit) for budget, limit in ((Budget.TOKENS_PER_HOUR, quotas.tokens_per_hour),
                                                                (Budget.TOKENS_PER_DAY, quotas.tokens_per_day))
            if limit is not None]
