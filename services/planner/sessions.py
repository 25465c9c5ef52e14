"""Conversations: the turns of a session run one at a time, in order, each from the transcript the
previous ones left (docs/architecture.md, "Sessions").

Routing makes one planner the owner of a session: a turn's run id is chosen on the session id's
partition (``Topics.run_id_for_session``), so every event of every turn lands on the session's partition
and the planner that holds it decides for all of them. A turn elsewhere would be decided by another
planner, in another order: it fails at once with ``invalid_task``, saying how to pick the run id.

Within the planner, a lock per session makes "is a turn running?" and the transition that acts on the
answer one step:

- a turn arrives (``admit``): it is admitted ``queued``; if none of the session's turns is still going,
  it begins at once, in the same transition, from the session's transcript cut to the token budget
  (``machine.begin``);
- a turn ends (``ended``): the oldest queued turn (by its task's offset on the partition) begins.

Nothing of this is only in memory: a queued turn is a run with status ``queued`` in PostgreSQL, and which
turns are still going is read from there (``TransitionStore.session_turns``), so a planner that dies
between the end of one turn and the start of the next leaves a queued turn that the partition's next
owner loads and begins (the sweeper looks at queued runs, ``Sweeper.due``). A redelivered task finds
its run recorded and changes nothing; a turn begins only from ``queued``, under the lock, so it begins
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agentstream.services.planner import machine, summaries
from agentstream.services.planner.state import QUEUED, RunState
from agentstream.services.planner.transcript import Transcript, Turn
from agentstream.streams.core import task_rules
from agentstream.streams.core.agents import parse_ref
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.core.outages import wait_out
from agentstream.streams.runtime.headers import SESSION_HEADER
from agentstream.streams.runtime.records import Context, Record
from agentstream.streams.store.sessions import SessionRow

if TYPE_CHECKING:
    from agentstream.services.planner.service import Planner

log = logging.getLogger(__name__)

SESSION_DELETED = "session_deleted"


class Sessions:
    """The planner's sessions: admission of turns, the start of the next one, and why a turn is stopped."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self._locks: dict[str, asyncio.Lock] = {}
        self._holders: dict[str, int] = {}
        #: Queued turns not yet begun, by session: a hint that spares a turn's end a query when nothing
        #: waits (most turns). It counts the turns this planner queued and those it found queued when it
        #: took their partition over (``loaded``); it may err high (a queued turn that failed to be
        #: recorded: one query too many), and where it errs low (a turn queued by the previous owner after
        #: that load) the sweeper begins the turn, as after a crash (``Sweeper.due``).
        self._queued: dict[str, int] = {}
        self.stats = {"queued": 0, "begun": 0, "refused": 0, "unqueued_ends": 0}

    @contextlib.asynccontextmanager
    async def hold(self, session: str | None) -> AsyncIterator[None]:
        """The session's lock (nothing for a run without a session). Locks exist while someone holds or
        waits for them, so a planner of many sessions keeps only the busy ones."""
        if session is None:
            yield
            return
        lock = self._locks.setdefault(session, asyncio.Lock())
        self._holders[session] = self._holders.get(session, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._holders[session] -= 1
            if not self._holders[session]:
                del self._holders[session], self._locks[session]

    def loaded(self, state: RunState) -> None:
        """A run of a partition this planner took over: count it if it is a queued turn."""
        if state.status == QUEUED and state.session is not None:
            self._queued[state.session] = self._queued.get(state.session, 0) + 1

    def order_keys(self, record: Record) -> Sequence[bytes]:
        """A task that says it is a turn of a session (``agentstream-session``) is handled after the
        session's earlier tasks on the partition, retries included (the runner's ``order_keys``): a turn
        waiting out an outage is not overtaken by the next one, here or at the partition's next owner."""
        session = record.headers.get(SESSION_HEADER) if record.topic == self.planner.runtime.topics.tasks else None
        return (b"session\x00" + session,) if session else ()

    def partition_problem(self, task: TaskSubmitted) -> str | None:
        """Why ``task``'s run id may not be a turn of its session: on another partition than the session's."""
        topics = self.planner.runtime.topics
        if task.session is None:
            return None
        wanted, got = topics.partition_for(task.session), topics.partition_for(task.run_id)
        if wanted == got:
            return None
        return (f"the run id {task.run_id!r} is on partition {got} of {topics.partitions}, and a turn of session "
                f"{task.session!r} must be on the session's, {wanted}: AgentClient.submit(session=...) picks such "
                "a run id; other producers draw run ids until murmur2(run id) % partitions equals murmur2(session "
                "id) % partitions (docs/contract.md, \"Sessions\")")

    async def admit(self, task: TaskSubmitted, ctx: Context | None, now: datetime) -> RunState:
        """The first state of the turn ``task`` (call under ``hold(task.session)``, and record it there):
        refused, queued behind a turn still going, or begun."""
        planner = self.planner
        store, prefix = planner.store, planner.runtime.topics.prefix
        problem = task_rules.session_problem(task.session) or self.partition_problem(task)
        row, turns = (await store.session_with_turns(prefix, task.session) if problem is None and task.session
                      else (None, []))
        state = await planner.admission.start(_handed(task, row), now, queued=True)
        if state.terminal:
            return state
        if problem is not None or task.session is None:
            self.stats["refused"] += 1
            return machine.fail(state, now, "invalid_task", problem or "no session")
        state = state.changed(session_epoch=row.epoch if row is not None else 0,
                              session_seq=ctx.record.offset if ctx is not None else 0)
        if [t for t in turns if t.run_id != task.run_id]:
            self.stats["queued"] += 1
            self._queued[task.session] = self._queued.get(task.session, 0) + 1
            return state
        self.stats["begun"] += 1
        return await self.begin(state, row, now)

    async def begin(self, state: RunState, row: SessionRow | None, now: datetime) -> RunState:
        """The turn ``state`` begins (``machine.begin``) from what ``transcript`` says."""
        history, fold = await self.transcript(state, row)
        return machine.begin(state, history, now, fold=fold, budget=self.planner.runtime.settings.sessions.token_budget)

    async def transcript(self, state: RunState, row: SessionRow | None) -> tuple[Transcript, tuple[Turn, ...]]:
        """What the turn ``state`` begins from: the session's transcript within the token budget (the
        oldest turns dropped, or, with ``overflow = summarise``, set apart to be summarised: the second
        value), or, for a turn that replays another (``replay_of``), the transcript recorded with that
        run, as it was."""
        if state.replay_of is not None:
            raw = await self.planner.store.load_state(state.replay_of)
            if raw is not None:
                original = RunState.from_json(raw)
                return Transcript.from_rows(state.session_epoch, original.session_turns, original.session_dropped), ()
        if row is None:
            return Transcript(epoch=state.session_epoch), ()
        sessions = self.planner.runtime.settings.sessions
        history = Transcript.from_rows(row.epoch, row.turns, row.dropped, summary=row.summary)
        if sessions.overflow == "summarise":
            return summaries.condense(history, sessions.token_budget)
        return history.fit(sessions.token_budget), ()

    async def ended(self, state: RunState) -> None:
        """The turn ``state`` has ended: begin the session's next one. A failure here is logged, not
        raised: the turn's own transition is recorded, and the sweeper begins a queued turn left behind."""
        if state.session is None:
            return
        try:
            await self.advance(state.session)
        except Exception as exc:
            log.warning("planner: the next turn of session %r did not begin (%s: %s); the sweeper will begin it",
                        state.session, type(exc).__name__, exc)

    async def advance(self, session: str, *, force: bool = False) -> None:
        """Begin the session's oldest queued turn if none of its turns is going (the ones that fail to
        begin, for a deleted session, are passed over). Every transition is recorded under the lock;
        what it asks for is published after. Unless ``force`` (the sweeper, which found a queued turn),
        nothing is looked up when this planner queued no turn of the session (``_queued``)."""
        planner = self.planner
        store, topics = planner.store, planner.runtime.topics
        begun: list[tuple[RunState, list]] = []
        async with self.hold(session):
            while True:
                if not force and not self._queued.get(session):
                    self.stats["unqueued_ends"] += 1
                    break
                turns = await store.session_turns(topics.prefix, session)
                if not any(t.status == QUEUED for t in turns):
                    self._queued.pop(session, None)  # (the hint erred high)
                    break
                if any(t.status != QUEUED for t in turns):
                    break
                state = await planner.load(turns[0].run_id)
                if state is None or state.status != QUEUED:
                    break
                now = datetime.now(UTC)
                new = await self.begin(state, await store.load_session(topics.prefix, session), now)
                outputs = machine.outputs(new, topics)
                await planner.commit(state, new, outputs, None, consumed=None)
                self.stats["begun"] += 1
                if self._queued.get(session, 0) > 1:
                    self._queued[session] -= 1
                else:
                    self._queued.pop(session, None)
                begun.append((new, outputs))
                if not new.terminal:
                    break
        for new, outputs in begun:  # outside any record: through a broker outage (as the sweeper publishes)
            await wait_out(functools.partial(planner.publish, outputs, new, None), f"publishing {new.run_id}")

    async def cancel_code(self, state: RunState) -> str:
        """``session_deleted`` for a turn whose session was deleted since it arrived (the delete asks its
        turns to stop), else ``cancelled``."""
        if state.session is None:
            return "cancelled"
        row = await self.planner.store.load_session(state.topic_prefix, state.session)
        return SESSION_DELETED if row is None or row.epoch != state.session_epoch else "cancelled"


def _handed(task: TaskSubmitted, row: SessionRow | None) -> TaskSubmitted:
    """``task``, going to the agent the session's last turn handed the conversation to when it names the
    agent that turn was handed from (a user keeps talking to "support" and billing answers)."""
    last = row.turns[-1] if row is not None and row.turns else None
    if task.agent is None or last is None or not last.get("handed_from") or not last.get("agent"):
        return task
    return replace(task, agent=last["agent"]) if parse_ref(task.agent)[0] == parse_ref(last["handed_from"])[0] else task


__all__: Sequence[str] = ["SESSION_DELETED", "Sessions"]
