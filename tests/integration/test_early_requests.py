"""A model request goes out while its transition is recorded (services/planner: ``EARLY``), so a planner
that dies in between leaves the answer on its way before the transition exists; the next planner must
keep that answer until it has redone the transition from the uncommitted record, not drop it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.events import InferenceCompleted
from agentstream.streams.core.ids import new_run_id, step_id
from agentstream.testing import Pipeline, isolated

pytestmark = pytest.mark.asyncio


async def test_an_answer_that_arrives_before_its_transition_is_recorded_is_kept(settings):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.", partitions=2)
    # The planner alone: no model answers the request, so the run can only finish with this answer.
    async with Pipeline.start(s, WorkerOptions(backend="scripted"), services=("planner",)) as pipe:
        run_id = new_run_id()
        answer = json.dumps({"action": "final_answer", "answer": "answered before it was asked"})
        early = InferenceCompleted.build(run_id=run_id, step=step_id(run_id, 0, "model"), service="inference",
                                         text=answer, finish_reason="stop")
        await (await pipe.client.runtime.send(pipe.client.topics.inference_results, early))
        runner = pipe.worker.runners[0]
        deadline = time.monotonic() + 30
        while runner.stats["deferred"] == 0:
            assert time.monotonic() < deadline, "the early answer was never put aside"
            await asyncio.sleep(0.05)

        await pipe.client.submit("What was asked?", tools=[], run_id=run_id, prefetch=False)
        result = await pipe.client.wait(run_id, timeout=30)

        assert result.ok, result
        assert result.answer == "answered before it was asked"
        assert runner.stats["deferred"] == 1
        assert pipe.worker.planner is not None and pipe.worker.planner.stats["rechecked"] == 0
