"""The planner service: one event in, one transition, its outputs out — never waiting on another service.

Per event (the runtime runs a run's events one after another, different runs in parallel):

1. load the run's state (memory; on a miss, PostgreSQL);
2. an event that changes nothing is a copy or stale: if it is the event applied last, republish the
   state's outputs (repairs a crash between the database commit and the publish); otherwise drop it;
3. ``machine.start``/``advance``; one (group-committed) transaction records the event, the steps and
   the new state, with a version check;
4. publish ``machine.outputs(state)``; the runtime commits the offset once the broker has them.

Deadlines and the sweeper: a timer fails runs past their deadline or maximum duration, and re-drives
runs that made no progress for longer than the step timeout (their pending request is republished with
the same ids, so a consumer that has it drops the copy), through the same per-run queue as events. It
finds them in memory and, every few seconds, in PostgreSQL (runs this planner never cached, expiries
that failed).

Fencing: Kafka assigns partitions, PostgreSQL decides who may act on them. When a partition is
assigned, the planner takes a lease on it (a new epoch in ``planner_leases``); every transition carries
the epoch and is refused once another planner holds a newer one (a planner paused past its session
timeout, or cut off from the broker, writes nothing over its successor's work), and a planner that
notices it was paused re-checks its leases before publishing anything. A run's cached state is kept
across a rebalance only when the lease's epoch shows nobody else held the partition meanwhile; a result
for a step the cached state does not know is re-checked against the database, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from aiokafka import TopicPartition

from agentstream.services.planner import machine
from agentstream.services.planner.cache import FINISHED_SIZE, RunCache
from agentstream.services.planner.snapshots import SnapshotPacer
from agentstream.services.planner.state import AWAITING_APPROVAL, RUNNING, TERMINAL, RunState
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.core import task_rules
from agentstream.streams.core.errors import TransitionRejected, VersionConflict
from agentstream.streams.core.events import (
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
    default_instance,
    event_id_for,
)
from agentstream.streams.core.kinds import PendingKind
from agentstream.streams.core.outages import wait_out
from agentstream.streams.core.signals import Deferred, Fenced
from agentstream.streams.runtime.dead_letters import refuse
from agentstream.streams.runtime.runner import SOURCE_HEADER, Context, Runtime, ServiceConfig, ServiceRunner
from agentstream.streams.store.history import (
    EventRow,
    Lease,
    RunRow,
    SourceUpdate,
    StepResult,
    StepRow,
    Transition,
    TransitionStore,
)
from agentstream.streams.telemetry import stages
from agentstream.streams.telemetry import trace_context as tracing

log = logging.getLogger(__name__)

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
DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_MAX_RUN_S = 3600.0
PRUNE_INTERVAL_S = 3600.0


class Planner:
    """``cache_size``: active runs kept in memory; ``finished_cache_size``: finished ones (services/planner/cache.py).
    ``step_timeout_s``: a run whose pending step shows no progress for this long is re-driven.
    ``max_run_s``: no run lasts longer than this after it started, deadline or not.
    ``sweep_interval_s``: how often PostgreSQL is searched for stalled runs."""

    def __init__(self, runtime: Runtime, store: TransitionStore, tools: ToolCatalog, *,
                 cache_size: int = 100_000, finished_cache_size: int = FINISHED_SIZE, deadline_tick_s: float = 0.25,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S, max_run_s: float = DEFAULT_MAX_RUN_S,
                 sweep_interval_s: float | None = None) -> None:
        self.runtime = runtime
        self.store = store
        self.tools = tools
        self.cache = RunCache(cache_size, finished_size=finished_cache_size)
        self.snapshots = SnapshotPacer(runtime.settings.snapshot_interval_ms / 1000)
        self.deadline_tick_s = deadline_tick_s
        self.step_timeout_s = step_timeout_s
        self.max_run = timedelta(seconds=max_run_s)
        self.sweep_interval_s = sweep_interval_s or min(10.0, max(1.0, step_timeout_s / 4))
        self.assigned: set[int] = set()
        self.runner: ServiceRunner | None = None
        #: Partition number -> its lease (resolved once PostgreSQL granted it).
        self.leases: dict[int, asyncio.Future[Lease]] = {}
        #: The epoch each partition had when this planner last held it (to tell whether its cache is stale).
        self._epochs: dict[int, int] = {}
        #: Leases to re-check before publishing: this process stalled long enough to lose its membership.
        self._suspect: set[int] = set()
        self._last_tick = time.monotonic()
        session_s = runtime.settings.session_timeout_ms / 1000
        self._stall_s = max(0.5, min(2.0, session_s / 3))
        self._sweeping: set[str] = set()
        self._redriven: dict[str, float] = {}
        self.stats = {"redriven": 0, "expired": 0, "rechecked": 0, "fenced": 0, "rejected": 0}
        #: Runs with results put aside (``_wait_for_request``): resolved by the run's next transition.
        self._advanced: dict[str, asyncio.Future[None]] = {}
        self._taking_over: asyncio.Task | None = None

    def service(self, *, concurrency: int = 64, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        config = ServiceConfig(name="planner", topics=topics.planner_inputs, group_id=topics.group("planner"),
                               concurrency=concurrency, route_by_run=True, **overrides)
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
                if state is None:  # the id is taken by a run of another pipeline (``_load``)
                    await self._refuse_taken(task, ctx)
                    return
        await self._transition(state, None, ctx, task)

    async def _refuse_taken(self, task: TaskSubmitted, ctx: Context) -> None:
        """``task`` names a run id another pipeline (a tenant's cell) already holds: its producer is told
        with a ``RunFailed(invalid_task)`` on this cell's outcomes, and nothing is recorded (the row is the
        other cell's). Without it, the producer would wait for an outcome that never comes (issue 37,
        finding 9). Deterministic ids: a redelivered task repeats the same event, which readers drop."""
        now = datetime.now(UTC)
        state = machine.fail(machine.start(task, [], now, self.max_run), now, "invalid_task",
                             f"the run id {task.run_id!r} is taken by a run of another cell; submit under "
                             "another run id")
        log.warning("planner: a task for %s refused: the run id belongs to another pipeline", task.run_id)
        await self._publish(machine.outputs(state, self.runtime.topics, snapshot=False), state, ctx)

    async def _start(self, task: TaskSubmitted, ctx: Context) -> None:
        """A new run. Its row is inserted without looking first: a run id that exists makes the
        insert conflict, which costs a query only on the rare redelivery instead of on every task."""
        now = datetime.now(UTC)
        checking = time.perf_counter()
        problem = await self._task_problem(task, now)
        tools = await self.tools.describe(task.tools) if problem is None else []
        if (clock := stages.clock()) is not None:
            clock.since("planner.task_checks", checking)
        state = machine.start(task, tools, now, self.max_run)
        over = await self._over_quota(task) if problem is None else None
        if problem is not None:
            state = machine.fail(state, now, "invalid_task", problem)
        elif over is not None:
            state = machine.fail(state, now, "quota_exceeded", over)
        elif task.deadline is not None and task.deadline <= now:
            state = machine.expire(state, now) or state
        state = state.changed(traceparent=ctx.traceparent or ctx.out_traceparent,  # the run's trace
                              topic_prefix=self.runtime.topics.prefix)
        await self._transition(None, state, ctx, task)

    async def _on_result(self, result: InferenceCompleted | ToolCallCompleted | RetrievalCompleted,
                         ctx: Context) -> None:
        state = await self._load(result.run_id)
        if state is not None and _ahead_of(state, result):
            # The cache has not seen this step requested: it may be older than the database (belt and
            # braces: leases and co-partitioned assignment should make this impossible).
            self.stats["rechecked"] += 1
            self.cache.pop(result.run_id)
            fresher = await self._load(result.run_id)
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
            new = machine.advance(state, result, datetime.now(UTC))
            limit = self.runtime.settings.quotas.tokens_per_run
            if limit is not None and new.status not in TERMINAL and new.prompt_tokens + new.completion_tokens > limit:
                new = machine.fail(new, datetime.now(UTC), "quota_exceeded",
                                   f"the run used {new.prompt_tokens + new.completion_tokens} tokens, over the "
                                   f"quota of {limit} per run")
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
        state = await self._load(request.run_id)
        new = machine.cancel(state, datetime.now(UTC), request.reason) if state is not None else None
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
        state = await self._load(decision.run_id)
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
                await self._publish(machine.outputs(old, self.runtime.topics), old, ctx)
            return
        new = new.changed(last_event_id=consumed.event_id)
        outputs = machine.outputs(new, self.runtime.topics, snapshot=not self.snapshots.hold(new))
        # A model or retrieval request has no effect outside its run: it goes out now, while the
        # transition is recorded, instead of after (the record is done once both are durable). A
        # result that comes back before the transition is recorded waits in the run's queue; after a
        # crash in between, for the transition to be redone (``_wait_for_request``).
        early = [(t, e) for t, e in outputs if type(e) in EARLY]
        later = [(t, e) for t, e in outputs if type(e) not in EARLY] if early else outputs
        if early:
            await self._publish(early, new, ctx)
        try:
            await self._commit(old, new, outputs, ctx, consumed=consumed)
        except TransitionRejected as exc:
            # This run's data cannot be stored; fail the run (from its last stored state) rather than
            # leave it waiting for an answer that can never be recorded.
            self.stats["rejected"] += 1
            log.error("planner: %s", exc)
            base = old if old is not None else new.changed(messages=(), pending_request={})
            new = machine.fail(base, datetime.now(UTC), "internal_error",
                               f"the run's next state could not be recorded: {exc}").changed(
                last_event_id=consumed.event_id)
            later = machine.outputs(new, self.runtime.topics)
            await self._commit(old, new, later, ctx, consumed=consumed)
        await self._publish(later, new, ctx)

    async def _task_problem(self, task: TaskSubmitted, now: datetime) -> str | None:
        """Submit refuses bad tasks; the same rules (streams/core/task_rules.py) guard against tasks published
        by other means. A deadline that passed is not a problem of the task: the run fails as late."""
        problem = (task_rules.event_id_problem(task.event_id)
                   or task_rules.task_problem(task=task.task, tools=task.tools, max_steps=task.max_steps,
                                              deadline=None, model=task.model, system_prompt=task.system_prompt,
                                              metadata=task.metadata, on_tool_error=task.on_tool_error,
                                              prefetch=task.prefetch, now=now))
        if problem:
            return problem
        unknown = await self.tools.unknown(task.tools)
        if unknown:
            return f"unknown tools: {', '.join(unknown)}"
        return None

    async def _over_quota(self, task: TaskSubmitted) -> str | None:
        """Why this pipeline's quotas refuse ``task`` (``Settings.quotas``), or None."""
        quotas = self.runtime.settings.quotas
        if quotas.max_steps is not None and task.max_steps > quotas.max_steps:
            return f"max_steps {task.max_steps} is over the quota of {quotas.max_steps}"
        if quotas.runs_in_flight is not None:
            active = await self.store.active_count(self.runtime.topics.prefix)
            if active >= quotas.runs_in_flight:
                return f"{active} runs are in flight, the quota is {quotas.runs_in_flight}"
        return None

    # -- state, history, outputs ---------------------------------------------------------------
    async def _load(self, run_id: str) -> RunState | None:
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
                                         step_index=new.step_index - 1,
                                         kind=new.pending_kind or REQUEST_KINDS[type(event)],
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
        lease = await self._lease(new.run_id)
        try:
            await self.store.write(Transition(run=run, events=events, sources=sources, steps_requested=requested,
                                              steps_completed=completed, lease=lease))
        except Fenced:
            self.stats["fenced"] += 1
            self._lose(lease.partition)
            raise
        except Exception:
            self.cache.pop(new.run_id)  # reload from the database on the retry
            raise
        self.cache.remember(new)
        waiter = self._advanced.pop(new.run_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # results put aside for this run are handled again

    async def _publish(self, outputs: list[tuple[str, Event]], state: RunState, ctx: Context | None) -> None:
        await self._check_lease(state.run_id)
        for topic, event in outputs:
            if ctx is not None:
                await ctx.emit(topic, event)
            else:
                headers = [(tracing.HEADER, tracing.child_of(state.traceparent).encode())]
                await (await self.runtime.send(topic, event, headers=headers))

    # -- leases (fencing) ---------------------------------------------------------------------------
    async def _lease(self, run_id: str) -> Lease:
        """This planner's lease on the run's partition, once PostgreSQL granted it; ``Fenced`` when the
        partition is not (or no longer) this planner's."""
        partition = self.runtime.topics.partition_for(run_id)
        lease = self.leases.get(partition)
        if lease is None:
            raise Fenced(f"partition {partition} (run {run_id}) is not assigned to this planner")
        try:
            return await asyncio.shield(lease)
        except asyncio.CancelledError:
            if lease.cancelled():  # revoked while waiting for it
                raise Fenced(f"partition {partition} was revoked before its lease was granted") from None
            raise

    async def _check_lease(self, run_id: str) -> None:
        """Before publishing: the lease is held and, if this process stalled long enough to have lost
        its group membership meanwhile, still current in PostgreSQL."""
        lease = await self._lease(run_id)
        now = time.monotonic()
        if now - self._last_tick > self._stall_s:
            self._suspect.update(self.leases)  # the timer has not run since the stall (or is not running)
            self._last_tick = now
        if lease.partition in self._suspect:
            if not await self.store.lease_is_current(lease):
                self.stats["fenced"] += 1
                self._lose(lease.partition)
                raise Fenced(f"partition {lease.partition} was taken over while this planner was stalled")
            self._suspect.discard(lease.partition)

    def _lose(self, partition: int) -> None:
        """Forget a partition another planner took over (its revocation will follow)."""
        lease = self.leases.pop(partition, None)
        if lease is not None and not lease.done():
            lease.cancel()
        self._forget_cached(lambda p: p == partition)

    def _forget_cached(self, which) -> None:
        partition_for = self.runtime.topics.partition_for
        self.cache.forget(lambda run_id: which(partition_for(run_id)))

    async def _take_over(self, leases: dict[int, asyncio.Future[Lease]]) -> None:
        """Lease the partitions (retrying through a database outage), then load their active runs, so
        their deadlines are watched at once. A cached run survives only if this planner held its
        partition right before (the epoch moved by one)."""
        while True:
            try:
                await self._lease_and_load(leases)
                return
            except Exception:
                log.exception("planner: taking partitions %s over failed; trying again", sorted(leases))
                await asyncio.sleep(1.0)

    async def _lease_and_load(self, leases: dict[int, asyncio.Future[Lease]]) -> None:
        topics = self.runtime.topics
        fresh: dict[int, Lease] = {}
        for partition in sorted(leases):
            async def acquire(p: int = partition) -> Lease:
                return await self.store.acquire_lease(topics.prefix, p, default_instance())

            lease = await wait_out(acquire, f"leasing partition {partition}")
            if self._epochs.get(partition) != lease.epoch - 1:
                self._forget_cached(lambda p, partition=partition: p == partition)
            self._epochs[partition] = lease.epoch
            fresh[partition] = lease
        states = await wait_out(lambda: self.store.active_states(topics.prefix), "loading active runs")
        for raw in states:
            state = RunState.from_json(raw)
            if topics.partition_for(state.run_id) in fresh and state.run_id not in self.cache:
                self.cache.remember(state)
        for partition, lease in fresh.items():
            if not leases[partition].done():  # (cancelled: revoked meanwhile)
                leases[partition].set_result(lease)

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        topics = self.runtime.topics
        self.assigned = {tp.partition for tp in assigned if tp.topic == topics.tasks}
        loop = asyncio.get_running_loop()
        new = {p: loop.create_future() for p in self.assigned if p not in self.leases}
        self.leases.update(new)
        self._forget_cached(lambda p: p not in self.assigned)
        if new:
            self._taking_over = asyncio.create_task(self._take_over(new), name="planner-take-over")

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """The runtime has drained the partitions' records: give their leases up (the cache stays, in
        case the partition comes straight back; ``_take_over`` decides)."""
        topics = self.runtime.topics
        if self._taking_over is not None:
            self._taking_over.cancel()
        for partition in {tp.partition for tp in revoked if tp.topic == topics.tasks}:
            lease = self.leases.pop(partition, None)
            if lease is not None and not lease.done():
                lease.cancel()
            self.assigned.discard(partition)

    # -- deadlines and the sweeper --------------------------------------------------------------
    async def run_deadlines(self, stop: asyncio.Event) -> None:
        """Fail runs past their deadline or maximum duration and re-drive stalled ones, each in its run's
        own queue (never racing its events): from memory every tick, from PostgreSQL every sweep."""
        next_sweep = time.monotonic() + self.sweep_interval_s
        next_prune = time.monotonic() + 60.0
        while not stop.is_set():
            await asyncio.sleep(self.deadline_tick_s)
            tick = time.monotonic()
            if tick - self._last_tick > self._stall_s + self.deadline_tick_s:
                log.warning("planner: the process stalled for %.1f s; leases are re-checked before publishing",
                            tick - self._last_tick)
                self._suspect.update(self.leases)
            self._last_tick = tick
            now = datetime.now(UTC)
            for state in self.cache.active():
                if self._due(state, now):
                    self._sweep(state.run_id)
            for run_id in self.snapshots.due(tick):
                self._publish_snapshot(run_id)
            if tick >= next_sweep:
                next_sweep = tick + self.sweep_interval_s
                await self._sweep_database()
            if tick >= next_prune:
                next_prune = tick + PRUNE_INTERVAL_S
                await self._prune_claims()

    def _publish_snapshot(self, run_id: str) -> None:
        """Publish a held snapshot (``SnapshotPacer``): the run's latest state, in its own queue, so no
        transition's snapshot can overtake it. Best effort: a run this planner no longer holds, or a
        broker that does not answer, leaves it to the run's next transition."""
        if self.runner is None:
            return

        async def publish() -> None:
            state = self.cache.get(run_id)
            if state is None or state.terminal:
                return
            try:
                await self._publish([(self.runtime.topics.runs, state.snapshot(service=machine.SERVICE))], state, None)
            except Exception as exc:
                log.info("planner: the held snapshot of %s was not published (%s: %s)", run_id,
                         type(exc).__name__, exc)
                return
            self.snapshots.sent(run_id)

        self.runner.run_keyed(run_id.encode(), publish)

    async def _prune_claims(self) -> None:
        """Claim-check bodies outlive the records that point at them by a day, then go (any planner)."""
        if self.runtime.claims is None:
            return
        try:
            pruned = await self.runtime.claims.prune()
        except Exception as exc:
            log.warning("planner: pruning claim-check bodies failed (%s: %s)", type(exc).__name__, exc)
            return
        if pruned:
            log.info("planner: pruned %d claim-check bodies", pruned)

    def _due(self, state: RunState, now: datetime) -> bool:
        left = machine.time_left(state, now)
        if left is not None and left <= 0:
            return True
        return (state.status == RUNNING and (now - state.updated_at).total_seconds() > self.step_timeout_s
                and time.monotonic() - self._redriven.get(state.run_id, 0.0) > self.step_timeout_s)

    async def _sweep_database(self) -> None:
        """Stalled runs this planner's memory does not hold (never loaded, evicted, an expiry that
        failed): PostgreSQL knows them."""
        try:
            stalled = await self.store.stalled(self.runtime.topics.prefix, idle_s=self.step_timeout_s)
        except Exception as exc:
            log.warning("planner: the sweep could not read the runs (%s: %s); next time", type(exc).__name__, exc)
            return
        mine = {p for p, lease in self.leases.items() if lease.done() and not lease.cancelled()}
        now = datetime.now(UTC)
        for raw in stalled:
            state = RunState.from_json(raw)
            if self.runtime.topics.partition_for(state.run_id) in mine and self._due(state, now):
                self._sweep(state.run_id)
        cutoff = time.monotonic() - 4 * self.step_timeout_s
        self._redriven = {r: t for r, t in self._redriven.items() if t > cutoff}

    def _sweep(self, run_id: str) -> None:
        if run_id in self._sweeping or self.runner is None:
            return
        self._sweeping.add(run_id)
        task = self.runner.run_keyed(run_id.encode(), lambda: self._sweep_run(run_id))
        task.add_done_callback(lambda _t: self._sweeping.discard(run_id))

    async def _sweep_run(self, run_id: str) -> None:
        """Expire the run if its time is up, else re-drive its pending step if it has not moved."""
        state = await self._load(run_id)
        if state is None or state.terminal:
            return
        now = datetime.now(UTC)
        new = machine.expire(state, now)
        if new is not None:
            outputs = machine.outputs(new, self.runtime.topics)
            await self._commit(state, new, outputs, None, consumed=None)
            self.stats["expired"] += 1
            await self._publish_durably(outputs, new)
        elif self._due(state, now) and state.status == RUNNING:
            self._redriven[run_id] = time.monotonic()
            self.stats["redriven"] += 1
            log.warning("planner: %s made no progress for %.0f s on %s; republishing its pending request", run_id,
                        (now - state.updated_at).total_seconds(), state.pending_step_id)
            await self._publish_durably(machine.outputs(state, self.runtime.topics), state)

    async def _publish_durably(self, outputs: list[tuple[str, Event]], state: RunState) -> None:
        """Publish outside any record (no redelivery would repair a failure): through a broker outage."""
        await wait_out(lambda: self._publish(outputs, state, None), f"publishing {state.run_id}")


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
