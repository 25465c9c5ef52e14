"""When a run's state goes to the compacted ``agent.runs`` topic: its final state and a state that
waits for a person's approval at once, a running run's at most once per interval
(``Settings.snapshot_interval_ms``, ``AGENTSTREAM_SNAPSHOT_INTERVAL_MS``, default 1 s).

The topic is a table of runs, for reading each run's latest state (compaction keeps one record per run);
the record of every transition is in PostgreSQL (``events``, ``steps``, ``runs``). Publishing a snapshot
after every transition put four records a run on the topic for the one that compaction keeps: a run of
three fast steps now writes one (its final state), and a long run one a second while it runs. Measured
in docs/benchmarks.md ("Performance, round two").

A held snapshot goes out when the interval is up, from the planner's timer, in the run's own queue
(after its in-flight records), with the run's latest state then — so a reader sees a running run's state
at most an interval (plus the timer's tick) old, and versions on the topic never go back. A planner that
stops holding snapshots loses them, which costs staleness, not correctness: the run's next transition,
or its end, publishes its state again.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from agentstream.services.planner.state import AWAITING_APPROVAL, RunState

#: Runs whose last publication is remembered; the oldest are forgotten first (their next snapshot is
#: then held one interval, as a new run's first is).
MAX_REMEMBERED = 100_000


class SnapshotPacer:
    """Decides, per transition, whether its snapshot is published with it or held, and which held
    snapshots are due."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._sent: OrderedDict[str, float] = OrderedDict()  # run id -> when its last snapshot went out
        self._due: dict[str, float] = {}  # run id -> when its held snapshot is to go out

    def hold(self, state: RunState, now: float | None = None) -> bool:
        """Whether ``state``'s snapshot waits (True) or goes out with its transition (False, and it
        counts as sent). A final state never waits, nor one awaiting approval; a running run's waits if
        its previous snapshot went out less than the interval ago, or none did yet (a short run then
        publishes only its end)."""
        run_id = state.run_id
        if state.terminal:
            self.forget(run_id)
            return False
        if self.interval_s <= 0:
            return False
        now = time.monotonic() if now is None else now
        if state.status == AWAITING_APPROVAL:  # a person is to act on it (docs/contract.md): no waiting
            self.sent(run_id, now)
            return False
        last = self._sent.get(run_id)
        if last is not None and now - last >= self.interval_s:
            self.sent(run_id, now)
            return False
        self._due.setdefault(run_id, (now if last is None else last) + self.interval_s)
        return True

    def due(self, now: float | None = None) -> list[str]:
        """The runs whose held snapshot is to go out now (they are no longer held)."""
        now = time.monotonic() if now is None else now
        ready = [run_id for run_id, at in self._due.items() if at <= now]
        for run_id in ready:
            del self._due[run_id]
        return ready

    def sent(self, run_id: str, now: float | None = None) -> None:
        self._due.pop(run_id, None)
        self._sent[run_id] = time.monotonic() if now is None else now
        self._sent.move_to_end(run_id)
        while len(self._sent) > MAX_REMEMBERED:
            self._sent.popitem(last=False)

    def forget(self, run_id: str) -> None:
        self._sent.pop(run_id, None)
        self._due.pop(run_id, None)

    @property
    def held(self) -> int:
        return len(self._due)
