"""The planner's memory of runs: the active ones, and a few recently finished.

An active run's state is read on every event of the run, so a planner keeps every active run it owns
(up to ``size``, 100,000 by default; beyond that the least recently used is evicted and read back from
PostgreSQL when needed). A finished run's state is read only for a late copy of one of its events (a
redelivery after a rebalance, a cancel after the end), so only the ``finished_size`` most recently
finished (1,000 by default) are kept; an older one is read from PostgreSQL in that rare case.

Keeping finished runs up to ``size`` as well, as the planner once did, cost more than memory: CPython's
full garbage collection stops the event loop for a time proportional to the objects in the process,
and 100,000 cached states are about 850,000 of them — a 0.6 s pause on this machine, every 25,000 or so
runs once the cache was full (bench/perf/planner_gc.py, docs/benchmarks.md).

The deadline timer looks at active runs four times a second; they are kept apart from finished ones,
so that costs CPU in proportion to the runs in flight, not to the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from agentstream.services.planner.state import RunState

#: Finished runs kept by default (see the module docstring).
FINISHED_SIZE = 1_000


class RunCache:
    """Active run states (least recently used evicted past ``size``) and the ``finished_size`` most
    recently finished, by run id."""

    def __init__(self, size: int, *, finished_size: int = FINISHED_SIZE) -> None:
        self.size = size
        self.finished_size = finished_size
        self._active: OrderedDict[str, RunState] = OrderedDict()
        self._finished: OrderedDict[str, RunState] = OrderedDict()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._active or run_id in self._finished

    def __len__(self) -> int:
        return len(self._active) + len(self._finished)

    def get(self, run_id: str) -> RunState | None:
        """The run's state (now the most recently used), or None."""
        state = self._active.get(run_id)
        if state is not None:
            self._active.move_to_end(run_id)
            return state
        state = self._finished.get(run_id)
        if state is not None:
            self._finished.move_to_end(run_id)
        return state

    def remember(self, state: RunState) -> None:
        if state.terminal:
            self._active.pop(state.run_id, None)
            _keep(self._finished, state, self.finished_size)
        else:
            self._finished.pop(state.run_id, None)  # (never expected: a finished run does not resume)
            _keep(self._active, state, self.size)

    def pop(self, run_id: str) -> None:
        self._active.pop(run_id, None)
        self._finished.pop(run_id, None)

    def forget(self, which: Callable[[str], bool]) -> None:
        """Forget the runs whose id ``which`` accepts."""
        for kept in (self._active, self._finished):
            for run_id in [r for r in kept if which(r)]:
                del kept[run_id]

    def active(self) -> Iterator[RunState]:
        """The states of the cached runs that have not ended (a snapshot: the cache may change meanwhile)."""
        return iter(list(self._active.values()))


def _keep(states: OrderedDict[str, RunState], state: RunState, limit: int) -> None:
    """``state`` as the most recently used of ``states``, evicting the least recently used past ``limit``."""
    states[state.run_id] = state
    states.move_to_end(state.run_id)
    while len(states) > limit:
        states.popitem(last=False)


__all__ = ["FINISHED_SIZE", "RunCache"]
