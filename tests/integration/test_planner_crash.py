"""kill -9 of the planner mid-run, then a restart: every run completes, no tool runs twice, and a session's
turns run once each, in order."""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from agentstream.services.worker import WorkerOptions
from agentstream.testing import Pipeline, isolated
from tests.integration.processes import start_worker, wait_for

pytestmark = pytest.mark.slow
RUNS = 20
# Two side effects per run, then an answer; the model takes 150 ms per step, so runs are mid-flight
# when the planner dies.
TASK = '[[slow:150]] [[tool:effect {"label": "first"}]] [[tool:effect {"label": "second"}]] [[answer:done]]'


async def test_planner_killed_mid_run_recovers_without_duplicate_effects(settings, effects_table, tmp_path):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    log = tmp_path / "planner.log"
    options = WorkerOptions(backend="scripted", tool_modules=("tests.integration.pipeline_tools",))
    async with Pipeline.start(s, options, services=("inference", "tools")) as pipe:
        planner = start_worker(s, "planner", log)
        try:
            pool = await pipe.client.pool()
            run_ids = [await pipe.client.submit(TASK, tools=["effect"], max_steps=8) for _ in range(RUNS)]
            # A conversation whose turns are running and queued when the planner dies.
            session = f"chat-{uuid.uuid4().hex[:6]}"
            turns = [await pipe.client.submit(text, tools=[], prefetch=False, session=session) for text in (
                "[[slow:150]] [[answer:a1]]", "[[slow:150]] [[answer:a2]]", "[[slow:150]] [[answer:a3]]", "[[recall]]")]

            async def some_effects() -> bool:
                return await pool.fetchval("SELECT count(*) FROM test_effects WHERE run_id = ANY($1)", run_ids) >= 5

            await wait_for(some_effects, 60, "five effects")
            planner.send_signal(signal.SIGKILL)
            planner.wait()
            at_kill = await pool.fetchval("SELECT count(*) FROM runs WHERE run_id = ANY($1) AND status = 'completed'",
                                          run_ids)
            assert at_kill < RUNS, "the planner was killed after every run had finished: nothing was tested"
            assert await pool.fetchval("SELECT count(*) FROM runs WHERE run_id = ANY($1) AND status = 'completed'",
                                       turns) < len(turns), "the conversation had ended: nothing was tested"

            planner = start_worker(s, "planner", log)
            results = await asyncio.gather(*(pipe.client.wait(r, timeout=90) for r in run_ids))
            answers = [(await pipe.client.wait(t, timeout=90)).answer for t in turns]
        finally:
            planner.kill()
            planner.wait()
        assert all(r.ok for r in results), [r for r in results if not r.ok]
        # The turns ran once each, in order, each from the transcript the ones before it left.
        assert answers == ["a1", "a2", "a3", "recall: a1 | a2 | a3"]
        details = await pipe.client.sessions.show(session)
        assert details is not None and [t["run_id"] for t in details.row.turns] == turns
        rows = await pool.fetch("SELECT run_id, label, count(*) AS n FROM test_effects WHERE run_id = ANY($1) "
                                "GROUP BY run_id, label", run_ids)
        assert {(r["run_id"], r["label"]) for r in rows} == {(r, lbl) for r in run_ids for lbl in ("first", "second")}
        duplicated = [(r["run_id"], r["label"], r["n"]) for r in rows if r["n"] != 1]
        assert not duplicated, f"tools executed more than once: {duplicated}"
        # Each run's history holds each event once, however often it was redelivered.
        dupes = await pool.fetchval(
            "SELECT count(*) FROM (SELECT step_id, event_type FROM events WHERE run_id = ANY($1) "
            "GROUP BY step_id, event_type HAVING count(*) > 1) d", run_ids)
        assert dupes == 0
