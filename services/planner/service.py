"""The planner service: one event in, one transition, its outputs out — never waiting on another service.

Per event (the runtime runs a run's events one after another, different runs in parallel):

1. load the run's state (memory; on a miss, PostgreSQL);
2. an event that changes nothing is a copy or stale: if it is the event applied last, republish the
   state's outputs (repairs a crash between the database commit and the publish); otherwise drop it;
3. ``machine.start``/``advance``; one (group-committed) transaction records the event, the steps and
   the new state, with a version check;
4. publish ``machine.outputs(state)``; the runtime commits the offset once the broker has them.

``Planner`` is the front: it dispatches each event and records and publishes the transition. The rest
lives beside it, one concern a module:

- ``admission.py``: which tasks become runs, the quotas;
- ``publishing.py``: the rows a transition writes to the history, and the order its outputs go out in;
- ``leases.py``: fencing (a lease per partition, checked by every transition) and the take-over after an
  assignment;
- ``sweeper.py``: the timer — deadlines, re-driving stalled runs, held snapshots, claim pruning.

A result for a step the cached state does not know is re-checked against the database, never dropped;
one the database does not know either is put aside until the run's next transition (``Deferred``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from agentstream.services.planner import machine, publishing, subagents
from agentstream.services.planner.admission import Admission
from agentstream.services.planner.cache import FINISHED_SIZE, RunCache
from agentstream.services.planner.leases import Leases
from agentstream.services.planner.publishing import RESULT_TYPES, Outputs
from agentstream.services.planner.refusals import Refusals
from agentstream.services.planner.sessions import Sessions
from agentstream.services.planner.snapshots import SnapshotPacer
from agentstream.services.planner.state import RunState
from agentstream.services.planner.sweeper import Sweeper
from agentstream.streams.catalog.agents import AgentCatalog
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.core.errors import TransitionRejected, VersionConflict
from agentstream.streams.core.events import (
    ApprovalDecided,
    Event,
    InferenceCompleted,
    InferenceRequested,
    RetrievalCompleted,
    RunCancelRequested,
    TaskSubmitted,
    ToolCallCompleted,
)
from agentstream.streams.core.signals import Deferred, Fenced
from agentstream.streams.runtime.dead_letters import refuse
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner
from agentstream.streams.store.history import TransitionStore
from agentstream.streams.telemetry.backlog import prompt_tokens_header

log = logging.getLogger(__name__)

DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_MAX_RUN_S = 3600.0


class Planner:
    """``agents``: the agent catalogue (default: the runtime's ``agent.agents``, read when a task names an agent).
    ``cache_size``: active runs kept in memory; ``finished_cache_size``: finished ones (services/planner/cache.py).
    ``step_timeout_s``: a run whose pending step shows no progress for this long is re-driven.
    ``max_run_s``: no run lasts longer than this after it started, deadline or not.
    ``sweep_interval_s``: how often PostgreSQL is searched for stalled runs."""

    def __init__(self, runtime: Runtime, store: TransitionStore, tools: ToolCatalog, *,
                 agents: AgentCatalog | None = None, cache_size: int = 100_000,
                 finished_cache_size: int = FINISHED_SIZE, deadline_tick_s: float = 0.25,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S, max_run_s: float = DEFAULT_MAX_RUN_S,
                 sweep_interval_s: float | None = None) -> None:
        self.runtime = runtime
        runtime.add_header_hook(InferenceRequested, prompt_tokens_header)  # the backlog signal's header
        self.store = store
        self.tools = tools
        self.cache = RunCache(cache_size, finished_size=finished_cache_size)
        self.snapshots = SnapshotPacer(runtime.settings.snapshot_interval_ms / 1000)
        self.step_timeout_s = step_timeout_s
        self.admission = Admission(runtime, store, tools, timedelta(seconds=max_run_s), agents=agents)
        self.agents = self.admission.agents  # where a task's ``agent`` resolves (closed with the worker)
        self.runner: ServiceRunner | None = None
        self.stats = {"redriven": 0, "expired": 0, "rechecked": 0, "fenced": 0, "rejected": 0}
        #: Turns of sessions: admitted in order, one at a time per session (services/planner/sessions.py).
        self.sessions = Sessions(self)
        self.leases = Leases(store, runtime.topics, self.cache, self.stats,
                             session_timeout_s=runtime.settings.session_timeout_ms / 1000,
                             on_loaded=self.sessions.loaded)
        self.sweeper = Sweeper(self, step_timeout_s=step_timeout_s, deadline_tick_s=deadline_tick_s,
                               sweep_interval_s=sweep_interval_s)
        #: Runs with results put aside (``_wait_for_request``): resolved by the run's next transition.
        self._advanced: dict[str, asyncio.Future[None]] = {}
        #: Intake records it dead-letters: their producers are told (services/planner/refusals.py).
        self.refusals = Refusals(self)

    @property
    def assigned(self) -> set[int]:
        """The partitions of the tasks topic assigned to this planner."""
        return self.leases.assigned

    def service(self, *, concurrency: int = 64, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        config = ServiceConfig(name="planner", topics=topics.planner_inputs, group_id=topics.group("planner"),
                               concurrency=concurrency, route_by_run=True, order_keys=self.sessions.order_keys,
                               on_rejected=self.refusals.rejected, **overrides)
        self.runner = ServiceRunner(self.runtime, config, self.handle, on_assigned=self.leases.on_assigned,
                                    on_revoked=self.leases.on_revoked)
        return self.runner

    async def run_deadlines(self, stop: asyncio.Event) -> None:
        """The timer (services/planner/sweeper.py), until ``stop`` is set."""
        await self.sweeper.run(stop)

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
                state = await self.load(task.run_id)
                if state is None:  # the id is taken by a run of another pipeline (``load``)
                    await self._refuse_taken(task, ctx)
                    return
        await self._transition(state, None, ctx, task)

    async def _refuse_taken(self, task: TaskSubmitted, ctx: Context) -> None:
        """``task`` names a run id another pipeline (a tenant's cell) already holds: its producer is told
        with a ``RunFailed(invalid_task)`` on this cell's outcomes, and nothing is recorded (the row is the
        other cell's). Without it, the producer would wait for an outcome that never comes (issue 37,
        finding 9). Deterministic ids: a redelivered task repeats the same event, which readers drop."""
        state = self.admission.taken(task, datetime.now(UTC))
        log.warning("planner: a task for %s refused: the run id belongs to another pipeline", task.run_id)
        await self.publish(machine.outputs(state, self.runtime.topics, snapshot=False), state, ctx)

    async def _start(self, task: TaskSubmitted, ctx: Context) -> None:
        """A new run. Its row is inserted without looking first: a run id that exists makes the
        insert conflict, which costs a query only on the rare redelivery instead of on every task."""
        async with self.sessions.hold(task.session):  # a turn of a session: decided and recorded in order
            now = datetime.now(UTC)
            state = await (self.admission.start(task, now) if task.session is None
                           else self.sessions.admit(task, ctx, now))
            state = state.changed(traceparent=ctx.traceparent or ctx.out_traceparent,  # the run's trace
                                  topic_prefix=self.runtime.topics.prefix)
            await self._transition(None, state, ctx, task)

    async def _on_result(self, result: InferenceCompleted | ToolCallCompleted | RetrievalCompleted,
                         ctx: Context) -> None:
        state = await self.load(result.run_id)
        if state is not None and _ahead_of(state, result):
            # The cache has not seen this step requested: it may be older than the database (belt and
            # braces: leases and co-partitioned assignment should make this impossible).
            self.stats["rechecked"] += 1
            self.cache.pop(result.run_id)
            fresher = await self.load(result.run_id)
            if fresher is not None and fresher.version != state.version:
                log.warning("planner: cached state of %s was stale (v%d, database v%d); re-checked", result.run_id,
                            state.version, fresher.version)
            state = fresher
        if state is None or _ahead_of(state, result):
            self._wait_for_request(result, ctx)
        new = None
        if state is None:
            log.warning("planner: %s for unknown run %s dropped", type(result).__name__, result.run_id)
        elif machine.is_prefetch_result(state, result):
            assert isinstance(result, RetrievalCompleted)
            new = machine.prefetched(state, result, datetime.now(UTC))
        elif machine.is_pending_result(state, result):
            now = datetime.now(UTC)
            new = await self.admission.charge_tokens(state, machine.advance(state, result, now), result.step_id)
            if (handoff := subagents.wants_handoff(new)) is not None:  # a recorded switch of definition
                new = await self.admission.hand_off(new, handoff, now)
        await self._transition(state, new, ctx, result)

    def _wait_for_request(self, result: Event, ctx: Context) -> None:
        """``result`` answers a step the run's recorded state has not requested (or a run not recorded):
        a model or retrieval request goes out while its transition is being recorded (``EARLY``), so a
        planner that died in between left the request published and the transition to be redone by
        this one, from the record that caused it — which is still uncommitted, so it comes here too,
        maybe after this result. Put the result aside until the run's next transition (once); a result
        still ahead after that is dropped."""
        if ctx.record.deferrals > 0 or not _is_step_of(result):
            return
        waiter = self._advanced.get(result.run_id)
        if waiter is None or waiter.done():
            waiter = self._advanced[result.run_id] = asyncio.get_running_loop().create_future()
        raise Deferred(f"{type(result).__name__} {result.step_id} answers a step the run has not recorded yet",
                       ready=waiter, timeout_s=self.step_timeout_s)

    async def _on_cancel(self, request: RunCancelRequested, ctx: Context) -> None:
        state = await self.load(request.run_id)
        code = await self.sessions.cancel_code(state) if state is not None and not state.terminal else "cancelled"
        new = machine.cancel(state, datetime.now(UTC), request.reason, code) if state is not None else None
        await self._transition(state, new, ctx, request)  # None: unknown, or already over

    async def _on_decision(self, decision: ApprovalDecided, ctx: Context) -> None:
        if self.runtime.settings.approvals == "recorded":
            # Only an approver's own database login decides (docs/security.md): the event says that a
            # decision was recorded, the record says which and by whom. Anyone who may write the tasks
            # topic can publish the event; without a record it changes nothing.
            recorded = await self.store.recorded_decision(decision.run_id, decision.step_id)
            if recorded is None:
                await self._refuse(decision, ctx, f"no decision on {decision.step_id} was recorded by an approver "
                                                  "(AGENTSTREAM_APPROVALS=recorded: agentstream approve, as an "
                                                  "approver's database login)")
                return
            approved, reason, decided_by = recorded
            decision = replace(decision, approved=approved, reason=reason, decided_by=decided_by)
        state = await self.load(decision.run_id)
        new = machine.decide(state, decision, datetime.now(UTC)) if state is not None else None
        if state is not None and new is None:
            log.info("planner: decision on %s ignored (not awaiting approval for that step)", decision.step_id)
        await self._transition(state, new, ctx, decision)

    async def _refuse(self, event: ApprovalDecided, ctx: Context, reason: str) -> None:
        """Dead-letter ``event`` as refused, under its run: nothing about the run changes."""
        log.warning("planner: refused a decision on %s (from %s): %s", event.step_id, event.producer.instance, reason)
        await refuse(self.runtime, ctx, event, service="planner", reason=reason)

    async def _transition(self, old: RunState | None, new: RunState | None, ctx: Context, consumed: Event) -> None:
        """Record and publish ``new``; or, when the event changes nothing, republish ``old``'s outputs if
        the event is a copy of the one applied last (its outputs may not have gone out before a crash).
        Republishing is harmless: the same events, with the same ids, which consumers drop."""
        if new is None:
            if old is not None and consumed.event_id == old.last_event_id:
                await self.publish(machine.outputs(old, self.runtime.topics), old, ctx)
                if old.terminal and old.session is not None:  # the next turn may not have begun (a crash)
                    await self.sessions.ended(old)
            return
        new = new.changed(last_event_id=consumed.event_id)
        outputs = machine.outputs(new, self.runtime.topics, snapshot=not self.snapshots.hold(new))
        # A model or retrieval request has no effect outside its run: it goes out now, while the
        # transition is recorded, instead of after (the record is done once both are durable). A
        # result that comes back before the transition is recorded waits in the run's queue; after a
        # crash in between, for the transition to be redone (``_wait_for_request``).
        early, later = publishing.split_early(outputs)
        if early:
            await self.publish(early, new, ctx)
        try:
            await self.commit(old, new, outputs, ctx, consumed=consumed)
        except TransitionRejected as exc:
            # This run's data cannot be stored; fail the run (from its last stored state) rather than
            # leave it waiting for an answer that can never be recorded.
            self.stats["rejected"] += 1
            log.error("planner: %s", exc)
            base = old if old is not None else new.changed(messages=(), pending_request=None)
            new = machine.fail(base, datetime.now(UTC), "internal_error",
                               f"the run's next state could not be recorded: {exc}").changed(
                last_event_id=consumed.event_id)
            later = machine.outputs(new, self.runtime.topics)
            await self.commit(old, new, later, ctx, consumed=consumed)
        await self.publish(later, new, ctx)
        if new.session is not None and new.terminal and old is not None and not old.terminal:
            await self.sessions.ended(new)  # the session's next turn begins

    # -- state, history, outputs ---------------------------------------------------------------
    async def load(self, run_id: str) -> RunState | None:
        """The run's state: cached, or read from PostgreSQL (and cached); None for a run never recorded
        and for another pipeline's run."""
        state = self.cache.get(run_id)
        if state is not None:
            return state
        raw = await self.store.load_state(run_id)
        if raw is None:
            return None
        state = RunState.from_json(raw)
        if state.topic_prefix != self.runtime.topics.prefix:
            # Another pipeline's run (a tenant's cell, a replay, a test) in the shared database: not this
            # planner's to change, whatever an event on its own topics names (docs/security.md, "Tenants").
            log.warning("planner: %s belongs to the pipeline under %r, not %r; ignored", run_id, state.topic_prefix,
                        self.runtime.topics.prefix)
            return None
        self.cache.remember(state)
        return state

    async def commit(self, old: RunState | None, new: RunState, outputs: Outputs, ctx: Context | None,
                     consumed: Event | None) -> None:
        """Record the transition in PostgreSQL (the event, its steps, the new state) under this planner's
        lease on the run's partition: ``Fenced`` when another planner holds a newer one, ``VersionConflict``
        when the run moved on meanwhile."""
        lease = await self.leases.lease(new.run_id)
        try:
            await self.store.write(publishing.transition(old, new, outputs, ctx, consumed, self.runtime.topics,
                                                         lease))
        except Fenced:
            self.stats["fenced"] += 1
            self.leases.lose(lease.partition)
            raise
        except Exception:
            self.cache.pop(new.run_id)  # reload from the database on the retry
            raise
        self.cache.remember(new)
        waiter = self._advanced.pop(new.run_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # results put aside for this run are handled again

    async def publish(self, outputs: Outputs, state: RunState, ctx: Context | None) -> None:
        """Publish ``outputs`` (publishing.py) once the lease on the run's partition is checked."""
        await self.leases.check(state.run_id)
        await publishing.send(self.runtime, outputs, state, ctx)


def _step_index(result: Event) -> int | None:
    """The index of the run's step ``result`` answers (steps are ``{run_id}:{index}:{kind}``), or None
    for anything else: a tool's own sub-request (services/tools: RetrievalWaiter), a foreign id."""
    if "/" in result.step_id or not result.step_id.startswith(result.run_id + ":"):
        return None
    _run, _, rest = result.step_id.rpartition(":")
    index = _run.rpartition(":")[2]
    return int(index) if index.isdigit() and rest in ("model", "tool", "retrieval") else None


def _ahead_of(state: RunState, result: Event) -> bool:
    """True when ``result`` answers a step of the run that ``state`` has not requested yet — so
    ``state`` is older than what was recorded, or what is being recorded."""
    index = _step_index(result)
    return index is not None and index >= state.step_index


def _is_step_of(result: Event) -> bool:
    """``result`` answers one of its run's steps or its prefetch (what the planner requests)."""
    return _step_index(result) is not None or result.step_id == machine.prefetch_step(result.run_id)


__all__: Sequence[str] = ["Planner"]
