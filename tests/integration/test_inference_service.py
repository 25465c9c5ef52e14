"""The inference service's behaviour in the pipeline: streamed tokens (and resuming them), cancellation,
concurrency equal to the engine's slots."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import pytest_asyncio

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.actions import parse_action
from agentstream.testing import Pipeline, isolated

pytestmark = pytest.mark.asyncio(loop_scope="module")
SLOTS = 2


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    options = WorkerOptions(backend="scripted",
                            backend_options={"slots": SLOTS, "chunk_chars": 4, "chunk_delay_s": 0.005})
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), options) as pipeline:
        yield pipeline


async def test_tokens_stream_live_and_resume_without_loss_or_repeat(pipe):
    run_id = await pipe.client.submit("What is 12 + 30?", tools=["calculator"])
    tokens = [t async for t in pipe.client.stream(run_id)]
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok
    status = await pipe.client.status(run_id)
    model_steps = {f"{run_id}:{s['step_index']}:model": s["result"]["text"]
                   for s in status["steps"] if s["kind"] == "model"}
    streamed: dict[str, str] = {}
    for token in tokens:
        streamed[token.step_id] = streamed.get(token.step_id, "") + token.text
    assert streamed == model_steps  # every token of every model step, in order, nothing else
    assert parse_action(streamed[tokens[-1].step_id]).answer == result.answer  # the answer streamed too
    assert len(tokens) > 4
    offsets = [t.offset for t in tokens]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    # A client that disconnected after the third chunk resumes from the next offset.
    resumed = [t async for t in pipe.client.stream(run_id, from_offset=tokens[2].offset + 1)]
    assert [(t.step_id, t.seq, t.text) for t in tokens[:3] + resumed] == [(t.step_id, t.seq, t.text) for t in tokens]


async def test_cancel_stops_the_run_and_its_generation(pipe):
    run_id = await pipe.client.submit("[[slow:5000]] [[answer:too late]]", tools=[])
    await asyncio.sleep(0.5)  # the model step is generating now
    t0 = time.monotonic()
    await pipe.client.cancel(run_id, reason="changed my mind")
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.status == "failed" and result.error_code == "cancelled" and "changed my mind" in result.error
    assert time.monotonic() - t0 < 2.0
    inference = pipe.worker.inference
    for _ in range(40):  # the generation was aborted, not left to finish its 5 s
        if run_id not in inference._generating:
            break
        await asyncio.sleep(0.05)
    assert run_id not in inference._generating
    assert time.monotonic() - t0 < 3.0
    quick = await pipe.client.submit("What is 1 + 1?", tools=["calculator"])
    assert (await pipe.client.wait(quick, timeout=10)).ok


async def test_the_engine_runs_exactly_its_slots_concurrently(pipe):
    backend = pipe.worker.backend
    backend.max_active = 0
    runs = [await pipe.client.submit(f"[[slow:300]] [[answer:run {i}]]", tools=[]) for i in range(8)]
    t0 = time.monotonic()
    results = await asyncio.gather(*(pipe.client.wait(r, timeout=60) for r in runs))
    elapsed = time.monotonic() - t0
    assert all(r.ok for r in results)
    assert backend.max_active == SLOTS  # batched up to the slots, never beyond: the rest waited in Kafka
    assert elapsed >= 8 * 0.3 / SLOTS * 0.9
