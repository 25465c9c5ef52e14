"""The planner's timer: deadlines, the sweeper, held snapshots and claim pruning.

A timer fails runs past their deadline or maximum duration, and re-drives runs that made no progress for
longer than the step timeout (their pending request is republished with the same ids, so a consumer that
has it drops the copy), through the same per-run queue as events. It finds them in memory and, every few
seconds, in PostgreSQL (runs this planner never cached, expiries that failed). The same timer publishes
the snapshots the pacer held back (services/planner/snapshots.py), notices that the process stalled (its
leases are then re-checked, services/planner/leases.py), and prunes claim-check bodies once an hour.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agentstream.services.planner import machine
from agentstream.services.planner.publishing import Outputs
from agentstream.services.planner.state import QUEUED, RUNNING, RunState
from agentstream.streams.core.outages import wait_out

if TYPE_CHECKING:
    from agentstream.services.planner.service import Planner

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 3600.0
#: How often a session with queued turns is looked at: its oldest begins if none of its turns is going. A
#: turn's end begins the next at once; this only recovers a planner that died in between (its successor
#: looks at once, the sessions it loaded having never been looked at).
QUEUED_CHECK_S = 5.0


class Sweeper:
    """``step_timeout_s``: a run whose pending step shows no progress for this long is re-driven.
    ``sweep_interval_s``: how often PostgreSQL is searched for stalled runs (default: a quarter of the
    step timeout, within 1 to 10 s). ``deadline_tick_s``: how often memory is."""

    def __init__(self, planner: Planner, *, step_timeout_s: float, deadline_tick_s: float,
                 sweep_interval_s: float | None = None) -> None:
        self.planner = planner
        self.step_timeout_s = step_timeout_s
        self.deadline_tick_s = deadline_tick_s
        self.sweep_interval_s = sweep_interval_s or min(10.0, max(1.0, step_timeout_s / 4))
        self._sweeping: set[str] = set()
        #: Run id -> when (``time.monotonic``) its pending request was last republished.
        self._redriven: dict[str, float] = {}
        #: Session -> when its queued turns were last looked at (``due``).
        self._sessions_looked: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Fail runs past their deadline or maximum duration and re-drive stalled ones, each in its run's
        own queue (never racing its events): from memory every tick, from PostgreSQL every sweep."""
        planner = self.planner
        next_sweep = time.monotonic() + self.sweep_interval_s
        next_prune = time.monotonic() + 60.0
        while not stop.is_set():
            await asyncio.sleep(self.deadline_tick_s)
            tick = time.monotonic()
            planner.leases.ticked(tick, slack=self.deadline_tick_s)
            now = datetime.now(UTC)
            for state in planner.cache.active():
                if self.due(state, now):
                    self.sweep(state.run_id)
            for run_id in planner.snapshots.due(tick):
                self.publish_snapshot(run_id)
            if tick >= next_sweep:
                next_sweep = tick + self.sweep_interval_s
                await self.sweep_database()
            if tick >= next_prune:
                next_prune = tick + PRUNE_INTERVAL_S
                await self.prune_claims()

    def due(self, state: RunState, now: datetime) -> bool:
        """Whether the sweeper is to look at the run: its time is up, or it is running and neither moved
        nor was re-driven for longer than the step timeout."""
        left = time_left(state, now)
        if left is not None and left <= 0:
            return True
        if state.status == QUEUED:  # its session's previous turn may have ended without beginning it (a crash)
            looked = self._sessions_looked.get(state.session or "", 0.0)
            return time.monotonic() - looked > min(QUEUED_CHECK_S, self.step_timeout_s)
        return (state.status == RUNNING and (now - state.updated_at).total_seconds() > self.step_timeout_s
                and time.monotonic() - self._redriven.get(state.run_id, 0.0) > self.step_timeout_s)

    def publish_snapshot(self, run_id: str) -> None:
        """Publish a held snapshot (``SnapshotPacer``): the run's latest state, in its own queue, so no
        transition's snapshot can overtake it. Best effort: a run this planner no longer holds, or a
        broker that does not answer, leaves it to the run's next transition."""
        planner = self.planner
        if planner.runner is None:
            return

        async def publish() -> None:
            state = planner.cache.get(run_id)
            if state is None or state.terminal:
                return
            try:
                await planner.publish([(planner.runtime.topics.runs, state.snapshot(service=machine.SERVICE))],
                                      state, None)
            except Exception as exc:
                log.info("planner: the held snapshot of %s was not published (%s: %s)", run_id,
                         type(exc).__name__, exc)
                return
            planner.snapshots.sent(run_id)

        planner.runner.run_keyed(run_id.encode(), publish)

    async def prune_claims(self) -> None:
        """Claim-check bodies outlive the records that point at them by a day, then go (any planner)."""
        claims = self.planner.runtime.claims
        if claims is None:
            return
        try:
            pruned = await claims.prune()
        except Exception as exc:
            log.warning("planner: pruning claim-check bodies failed (%s: %s)", type(exc).__name__, exc)
            return
        if pruned:
            log.info("planner: pruned %d claim-check bodies", pruned)

    async def sweep_database(self) -> None:
        """Stalled runs this planner's memory does not hold (never loaded, evicted, an expiry that
        failed): PostgreSQL knows them."""
        planner = self.planner
        topics = planner.runtime.topics
        try:
            stalled = await planner.store.stalled(topics.prefix, idle_s=self.step_timeout_s)
        except Exception as exc:
            log.warning("planner: the sweep could not read the runs (%s: %s); next time", type(exc).__name__, exc)
            return
        mine = planner.leases.granted()
        now = datetime.now(UTC)
        for raw in stalled:
            state = RunState.from_json(raw)
            if topics.partition_for(state.run_id) in mine and self.due(state, now):
                self.sweep(state.run_id)
        cutoff = time.monotonic() - 4 * self.step_timeout_s
        self._redriven = {r: t for r, t in self._redriven.items() if t > cutoff}
        self._sessions_looked = {s: t for s, t in self._sessions_looked.items() if t > cutoff}

    def sweep(self, run_id: str) -> None:
        """Look at the run in its own queue (``sweep_run``), unless that is already under way."""
        runner = self.planner.runner
        if run_id in self._sweeping or runner is None:
            return
        self._sweeping.add(run_id)
        task = runner.run_keyed(run_id.encode(), lambda: self.sweep_run(run_id))
        task.add_done_callback(lambda _t: self._sweeping.discard(run_id))

    async def sweep_run(self, run_id: str) -> None:
        """Expire the run if its time is up, else re-drive its pending step if it has not moved."""
        planner = self.planner
        state = await planner.load(run_id)
        if state is None or state.terminal:
            return
        now = datetime.now(UTC)
        new = machine.expire(state, now)
        if new is not None:
            outputs = machine.outputs(new, planner.runtime.topics)
            await planner.commit(state, new, outputs, None, consumed=None)
            planner.stats["expired"] += 1
            await self._publish_durably(outputs, new)
            await planner.sessions.ended(new)  # a turn of a session: the next one begins
        elif state.status == QUEUED and state.session is not None:
            self._sessions_looked[state.session] = time.monotonic()
            await planner.sessions.advance(state.session, force=True)
        elif self.due(state, now) and state.status == RUNNING:
            self._redriven[run_id] = time.monotonic()
            planner.stats["redriven"] += 1
            log.warning("planner: %s made no progress for %.0f s on %s; republishing its pending request", run_id,
                        (now - state.updated_at).total_seconds(), state.pending_step_id)
            await self._publish_durably(machine.outputs(state, planner.runtime.topics, redrive=True), state)

    async def _publish_durably(self, outputs: Outputs, state: RunState) -> None:
        """Publish outside any record (no redelivery would repair a failure): through a broker outage."""
        await wait_out(lambda: self.planner.publish(outputs, state, None), f"publishing {state.run_id}")


def time_left(state: RunState, now: datetime) -> float | None:
    """Seconds until the run's deadline or maximum duration, whichever comes first (None: no limit)."""
    limits = [t for t in (state.deadline, state.expires_at) if t is not None]
    return min(limits).timestamp() - now.timestamp() if limits else None
