"""The planner's memory of runs: the most recently used states, and which of them are still active.

The deadline timer looks at active runs four times a second; a planner keeps up to ``cache_size``
states (100,000 by default), most of them finished once it has run for a while. Iterating all of them
on every tick cost CPU in proportion to the cache rather than to the runs in flight, so the active
ones are kept apart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from agentstream.services.planner.state import RunState


class RunCache:
    """Least recently used run states, by run id, with the active (not terminal) ones indexed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._active: dict[str, None] = {}

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def get(self, run_id: str) -> RunState | None:
        """The run's state (now the most recently used), or None."""
        state = self._states.get(run_id)
        if state is not None:
            self._states.move_to_end(run_id)
        return state

    def remember(self, state: RunState) -> None:
        self._states[state.run_id] = state
        self._states.move_to_end(state.run_id)
        if state.terminal:
            self._active.pop(state.run_id, None)
        else:
            self._active[state.run_id] = None
        while len(self._states) > self.size:
            run_id, _ = self._states.popitem(last=False)
            self._active.pop(run_id, None)

    def pop(self, run_id: str) -> None:
        self._states.pop(run_id, None)
        self._active.pop(run_id, None)

    def forget(self, which: Callable[[str], bool]) -> None:
        """Forget the runs whose id ``which`` accepts."""
        for run_id in [r for r in self._states if which(r)]:
            self.pop(run_id)

    def active(self) -> Iterator[RunState]:
        """The states of the cached runs that have not ended (a snapshot: the cache may change meanwhile)."""
        return iter([self._states[r] for r in self._active])


__all__ = ["RunCache"]
