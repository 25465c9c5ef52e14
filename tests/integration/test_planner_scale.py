"""Several planner processes, scaled while runs are in flight: every run completes, every effect once.

Each run's model asks for a tool, a retrieval, then two more tools, so its events cross all four of the
planner's input topics; with aiokafka's default round-robin assignment and three planners, partition
``p`` of those topics went to different planners and most runs hung (issue 11). The co-partitioned
assignor (streams/kafka/assignor.py) gives a planner partition ``p`` of every input topic.
"""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from agentstream.services.worker import WorkerOptions
from agentstream.testing import Pipeline, isolated
from tests.integration.processes import start_worker, stop, wait_for_members

pytestmark = pytest.mark.slow
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")
TASK = ('[[tool:effect {"label": "a"}]] [[retrieve:kafka log compaction]] [[tool:effect {"label": "b"}]] '
        '[[tool:effect {"label": "c"}]] [[answer:done]]')
LABELS = ("a", "b", "c")


async def _check_effects(pool, run_ids: list[str]) -> None:
    rows = await pool.fetch("SELECT run_id, label, count(*) AS n FROM test_effects WHERE run_id = ANY($1) "
                            "GROUP BY run_id, label", run_ids)
    assert {(r["run_id"], r["label"]) for r in rows} == {(r, lbl) for r in run_ids for lbl in LABELS}
    assert not [r for r in rows if r["n"] != 1], "a tool ran more than once for one step"
    retrievals = await pool.fetchval("SELECT count(*) FROM steps WHERE run_id = ANY($1) AND kind = 'retrieval' "
                                     "AND status IN ('completed', 'failed')", run_ids)
    assert retrievals == len(run_ids)


@pytest.mark.parametrize("planners", [3, 5])
async def test_every_run_completes_with_several_planners(settings, effects_table, tmp_path, planners):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.", partitions=8)
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS)
    async with Pipeline.start(s, options, services=("inference", "tools", "retrieval")) as pipe:
        procs = [start_worker(s, "planner", tmp_path / f"planner{i}.log") for i in range(planners)]
        try:
            await wait_for_members(s.kafka_bootstrap, pipe.worker.runtime.topics.group("planner"), planners)
            run_ids = await asyncio.gather(*(pipe.client.submit(TASK, tools=["effect"], max_steps=10, deadline=120)
                                             for _ in range(60)))
            results = await asyncio.gather(*(pipe.client.wait(r, timeout=150) for r in run_ids))
        finally:
            for proc in procs:
                stop(proc)
        assert [r for r in results if not r.ok] == []
        await _check_effects(await pipe.client.pool(), list(run_ids))


async def test_scaling_planners_up_and_down_under_load(settings, effects_table, tmp_path):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.", partitions=8)
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS)
    group = None
    async with Pipeline.start(s, options, services=("inference", "tools", "retrieval")) as pipe:
        group = pipe.worker.runtime.topics.group("planner")
        procs = [start_worker(s, "planner", tmp_path / f"planner{i}.log") for i in range(2)]
        try:
            await wait_for_members(s.kafka_bootstrap, group, 2)
            run_ids: list[str] = []
            enough = asyncio.Event()

            async def submit_steadily(every_s: float) -> None:
                while not enough.is_set():
                    run_ids.append(await pipe.client.submit("[[slow:100]] " + TASK, tools=["effect"], max_steps=10,
                                                            deadline=150))
                    await asyncio.sleep(every_s)

            async def settle(runs: int = 5) -> None:
                """Until ``runs`` runs submitted from now on have completed, on the planners there are now
                (rather than a fixed sleep or a fixed number of runs)."""
                first = len(run_ids)
                while len(run_ids) < first + runs:
                    assert not load.done(), load
                    await asyncio.sleep(0.05)
                await asyncio.gather(*(pipe.client.wait(r, timeout=150) for r in run_ids[first:first + runs]))

            load = asyncio.create_task(submit_steadily(0.1))
            await settle()  # on two planners
            procs.append(start_worker(s, "planner", tmp_path / "planner2.log"))  # 2 → 3
            await wait_for_members(s.kafka_bootstrap, group, 3)
            await settle()  # on three
            in_flight_at_scale_down = len(run_ids)
            await asyncio.to_thread(stop, procs.pop(0), signal.SIGTERM)  # 3 → 2, gracefully, the load going on
            await settle()  # on the two left
            enough.set()
            await load
            results = await asyncio.gather(*(pipe.client.wait(r, timeout=150) for r in run_ids))
        finally:
            for proc in procs:
                stop(proc)
        assert 0 < in_flight_at_scale_down < len(run_ids), "the scaling did not happen under load"
        assert [r for r in results if not r.ok] == []
        await _check_effects(await pipe.client.pool(), run_ids)
