"""The pipeline with the real CPU model (llama.cpp + SmolLM2-135M), not a scripted stand-in."""

from __future__ import annotations

import json
import uuid

import pytest
import pytest_asyncio
from jsonschema.validators import Draft202012Validator

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.actions import parse_action
from agentstream.testing import Pipeline, isolated

pytest.importorskip("xllamacpp", reason="the llama.cpp backend needs xllamacpp (make venv installs it)")
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    """One pipeline (one model load) for the module's runs."""
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    options = WorkerOptions(backend="llamacpp", backend_options={"slots": 2})
    async with Pipeline.start(s, options) as pipeline:
        yield pipeline


async def test_a_real_model_drives_a_run_with_schema_valid_actions(pipe):
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


async def test_guided_decoding_gives_the_real_model_an_answer_of_the_output_schema(pipe):
    """The output schema is the grammar of the final answer: a 135M-parameter model answers with JSON of
    that shape, and the planner's check passes it through as the outcome's ``output``."""
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40}}}
    run_id = await pipe.client.submit("Name the capital of France.", tools=[], prefetch=False, max_steps=4,
                                      output_schema=schema, seed=1)
    result = await pipe.client.wait(run_id, timeout=180)
    assert result.ok, result
    assert isinstance(result.output, dict) and Draft202012Validator(schema).is_valid(result.output), result
    assert json.loads(result.answer or "") == result.output
    replies = [s["result"]["text"] for s in (await pipe.client.status(run_id))["steps"] if s["kind"] == "model"]
    answers = [a for a in (parse_action(r, structured=True) for r in replies) if a.kind == "final_answer"]
    assert len(answers) == 1  # the grammar held: the first answer already matched (no retry was needed)
