"""The sweeper's decisions (services/planner/sweeper.py) on an in-memory broker and history: which runs are
due, what sweeping one does (expire it, or republish its pending request with the same ids), and that the
history is swept only for the partitions this planner holds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from agentstream.services.planner import machine
from agentstream.streams.core.events import RunFailed, TaskSubmitted

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, names, run_ids, settings

STEP_TIMEOUT_S = 0.05


def task(run_id: str, **kw) -> TaskSubmitted:
    payload = {"task": "What is 2 + 2?", "tools": ["calculator"], "max_steps": 5, **kw}
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", **payload)


async def rig(*partitions: int, kafka: FakeKafka | None = None, store: MemoryHistory | None = None,
              step_timeout_s: float = STEP_TIMEOUT_S) -> PlannerRig:
    r = PlannerRig(kafka or FakeKafka(), store or MemoryHistory(), settings(partitions=2),
                   step_timeout_s=step_timeout_s)
    await r.take(*(partitions or (0, 1)))
    return r


async def until(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


async def test_which_runs_are_due():
    r = await rig(step_timeout_s=60)
    due = r.planner.sweeper.due
    now = datetime.now(UTC)
    running = machine.start(task("r"), [], now, timedelta(hours=1))
    idle = running.changed(updated_at=now - timedelta(seconds=61))
    assert not due(running, now)
    assert due(idle, now)  # no progress for longer than the step timeout
    assert not due(idle.changed(status="awaiting_approval"), now)  # a person may take their time
    assert due(running.changed(deadline=now - timedelta(seconds=1)), now)  # its deadline passed
    assert due(running.changed(expires_at=now), now)  # its maximum duration is up
    assert due(idle.changed(status="awaiting_approval", expires_at=now), now)  # ... even waiting for a person


async def test_sweeping_a_run_past_its_deadline_fails_it():
    r = await rig()
    (run_id,) = run_ids(r.topics, 0)
    await r.feed(task(run_id, deadline=datetime.now(UTC) + timedelta(milliseconds=30)))
    await asyncio.sleep(0.04)
    await r.planner.sweeper.sweep_run(run_id)
    state = r.store.state(run_id)
    assert (state.status, state.error_code) == ("failed", "deadline_exceeded")
    outcome = r.sent()[-1]
    assert isinstance(outcome, RunFailed) and outcome.error_code == "deadline_exceeded"
    assert r.planner.stats["expired"] == 1 and r.store.transitions[-1].lease is not None


async def test_sweeping_a_stalled_run_republishes_its_request_with_the_same_ids_once_a_timeout():
    r = await rig()
    (run_id,) = run_ids(r.topics, 0)
    await r.feed(task(run_id))
    first = r.sent()
    await asyncio.sleep(STEP_TIMEOUT_S + 0.01)
    mark = len(r.kafka.produced)
    await r.planner.sweeper.sweep_run(run_id)
    again = r.sent(since=mark)
    assert [e.event_id for e in again] == [e.event_id for e in first]  # consumers that have them drop them
    assert r.store.runs[run_id].version == 1 and r.planner.stats["redriven"] == 1  # nothing recorded
    state = r.store.state(run_id)
    assert not r.planner.sweeper.due(state, datetime.now(UTC))  # re-driven just now: left alone a while
    await r.planner.sweeper.sweep_run(run_id)
    assert r.planner.stats["redriven"] == 1 and r.sent(since=mark) == again


async def test_the_history_is_swept_only_for_the_partitions_this_planner_holds():
    kafka, store = FakeKafka(), MemoryHistory()
    a = await rig(0, kafka=kafka, store=store)
    b = await rig(1, kafka=kafka, store=store)
    (mine,), (theirs,) = run_ids(a.topics, 0), run_ids(a.topics, 1)
    await a.feed(task(mine))
    await b.feed(task(theirs))
    a.planner.cache.forget(lambda _run_id: True)  # only the history knows them now (evicted, say)
    a.planner.service()  # the runner whose per-run queues the sweeps run in
    await asyncio.sleep(STEP_TIMEOUT_S + 0.01)
    mark = len(kafka.produced)
    await a.planner.sweeper.sweep_database()
    await until(lambda: a.planner.stats["redriven"] >= 1, "the sweep of a's run")
    await asyncio.sleep(0.01)
    assert a.planner.stats["redriven"] == 1 and theirs not in a.planner.cache
    assert {e.run_id for e in a.sent(since=mark)} == {mine}
    assert names(a.sent(since=mark)) == ["RetrievalRequested", "InferenceRequested"]
