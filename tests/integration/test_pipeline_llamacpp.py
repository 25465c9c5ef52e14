"""The pipeline with the real CPU model (llama.cpp + SmolLM2-135M), not a scripted stand-in."""

from __future__ import annotations

import uuid

import pytest

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.actions import parse_action
from agentstream.testing import Pipeline, isolated

pytest.importorskip("xllamacpp", reason="the llama.cpp backend needs xllamacpp (make venv installs it)")
pytestmark = pytest.mark.slow


async def test_a_real_model_drives_a_run_with_schema_valid_actions(settings):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    options = WorkerOptions(backend="llamacpp", backend_options={"slots": 2})
    async with Pipeline.start(s, options) as pipe:
        run_id = await pipe.client.submit("What is 17 * 23?", tools=["calculator"], max_steps=4)
        result = await pipe.client.wait(run_id, timeout=180)
        status = await pipe.client.status(run_id)
    model_steps = [step for step in status["steps"] if step["kind"] == "model"]
    assert model_steps and all(step["status"] == "completed" for step in model_steps)
    for step in model_steps:  # the grammar held: every reply is a usable action
        parse_action(step["result"]["text"])
        assert step["result"]["completion_tokens"] > 0 and step["result"]["model"]
    # A 135M-parameter model is not a reliable agent; the run must still end cleanly either way.
    assert result.status == "completed" or result.error_code == "max_steps", result
    if result.ok:
        tool_steps = [s for s in status["steps"] if s["kind"] == "tool"]
        assert tool_steps and tool_steps[0]["request"]["tool"] == "calculator"
    if len(model_steps) > 1:  # the run's later steps found its earlier prompt in the engine's cache
        later = model_steps[1]["result"]
        assert 0 < later["cached_prompt_tokens"] <= later["prompt_tokens"]
