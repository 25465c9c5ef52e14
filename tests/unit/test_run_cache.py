"""The planner's run cache: least recently used eviction, a small memory of finished runs, and the active runs
the deadline timer reads."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from agentstream.services.planner import machine
from agentstream.services.planner.cache import RunCache
from agentstream.streams.core.events import TaskSubmitted

NOW = datetime(2026, 12, 3, tzinfo=UTC)
RUNNING = machine.start(TaskSubmitted.build(run_id="r", step="r:task", service="t", task="t", tools=[], max_steps=3),
                        [], NOW)
FINISHED = machine.fail(RUNNING, NOW, "internal_error", "done")


def state(run_id: str, *, finished: bool = False):
    return replace(FINISHED if finished else RUNNING, run_id=run_id)


def test_active_lists_only_runs_that_have_not_ended():
    cache = RunCache(10)
    cache.remember(state("a"))
    cache.remember(state("b", finished=True))
    cache.remember(state("c"))
    assert [s.run_id for s in cache.active()] == ["a", "c"]
    cache.remember(state("a", finished=True))  # a ends
    assert [s.run_id for s in cache.active()] == ["c"]
    assert "a" in cache and len(cache) == 3


def test_eviction_and_forgetting_drop_runs_from_the_active_index_too():
    cache = RunCache(2)
    cache.remember(state("a"))
    cache.remember(state("b"))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.remember(state("c"))  # evicts b
    assert "b" not in cache and [s.run_id for s in cache.active()] == ["a", "c"]
    cache.forget(lambda run_id: run_id == "a")
    cache.pop("missing")
    assert "a" not in cache and [s.run_id for s in cache.active()] == ["c"]


def test_only_the_most_recently_finished_runs_are_kept_and_active_ones_never_make_room_for_them():
    cache = RunCache(3, finished_size=2)
    cache.remember(state("active"))
    for run_id in ("f1", "f2", "f3"):
        cache.remember(state(run_id))
        cache.remember(state(run_id, finished=True))  # ends: moves from the active runs to the finished
    assert "f1" not in cache and "f2" in cache and "f3" in cache  # two finished at most
    assert "active" in cache and [s.run_id for s in cache.active()] == ["active"]
    assert cache.get("f2") is not None  # f2 is now the most recently used finished run
    cache.remember(state("f4", finished=True))  # evicts f3, not f2
    assert "f3" not in cache and "f2" in cache and len(cache) == 3

