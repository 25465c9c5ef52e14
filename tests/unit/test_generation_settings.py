"""Generation settings per task (max tokens, temperature, top-p, stop strings, seed): the pipeline's defaults
and bounds (streams/config/generation.py), the task rules, the run that keeps them, the request that carries
them, what each backend sends its engine, and a long final answer streamed as tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer

from agentstream.cli.run import _schema_option
from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.openai_compat import OpenAIBackend
from agentstream.services.inference.backends.scripted import ScriptedBackend
from agentstream.services.inference.service import InferenceService
from agentstream.services.planner import machine
from agentstream.services.planner.state import RunState, Sampling
from agentstream.streams.config.generation import GenerationSettings
from agentstream.streams.config.settings import Settings
from agentstream.streams.core import task_rules
from agentstream.streams.core.actions import parse_action
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.events import (
    Event,
    InferenceCompleted,
    InferenceRequested,
    Message,
    TaskSubmitted,
    TokenChunk,
)
from agentstream.streams.kafka.topics import Topics

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TOPICS = Topics()


def _task(**kw: Any) -> TaskSubmitted:
    payload = {"task": "Say hi", "tools": [], "max_steps": 3, "prefetch": False, **kw}
    return TaskSubmitted.build(run_id="r", step="r:task", service="client", created_at=NOW, **payload)


def _request(state: RunState) -> InferenceRequested:
    (_, request), _ = machine.outputs(state, TOPICS)
    assert isinstance(request, InferenceRequested)
    return request


# -- the settings and the task rules --------------------------------------------------------------------

def test_the_defaults_keep_todays_behaviour_and_the_environment_changes_them(monkeypatch: pytest.MonkeyPatch):
    assert GenerationSettings.load() == GenerationSettings(max_tokens=256, max_tokens_limit=4096,
                                                           max_answer_chars=2000, output_retries=2)
    monkeypatch.setenv("AGENTSTREAM_MODEL_MAX_TOKENS", "512")
    monkeypatch.setenv("AGENTSTREAM_MAX_TOKENS_LIMIT", "8192")
    monkeypatch.setenv("AGENTSTREAM_MAX_ANSWER_CHARS", "8000")
    monkeypatch.setenv("AGENTSTREAM_OUTPUT_RETRIES", "0")
    assert Settings.load().generation == GenerationSettings(max_tokens=512, max_tokens_limit=8192,
                                                            max_answer_chars=8000, output_retries=0)


@pytest.mark.parametrize(("env", "message"), [
    ({"AGENTSTREAM_MODEL_MAX_TOKENS": "5000"}, "AGENTSTREAM_MODEL_MAX_TOKENS=5000 must be from 1 to"),
    ({"AGENTSTREAM_MAX_TOKENS_LIMIT": "999999"}, "AGENTSTREAM_MAX_TOKENS_LIMIT=999999 must be from 1 to 131072"),
    ({"AGENTSTREAM_OUTPUT_RETRIES": "-1"}, "AGENTSTREAM_OUTPUT_RETRIES='-1' must be a whole number"),
    ({"AGENTSTREAM_MAX_ANSWER_CHARS": "lots"}, "AGENTSTREAM_MAX_ANSWER_CHARS='lots' must be a positive integer"),
])
def test_settings_out_of_bounds_are_refused_naming_the_variable(monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        GenerationSettings.load()


def _problem(limit: int = 4096, **kw: Any) -> str | None:
    given = {"output_schema": None, "max_tokens": None, "temperature": None, "top_p": None, "stop": [],
             "seed": None, **kw}
    return task_rules.generation_problem(**given, max_tokens_limit=limit)


@pytest.mark.parametrize(("given", "reason"), [
    ({"max_tokens": 0}, "max_tokens must be between 1 and 4096"),
    ({"max_tokens": 5000}, "the bound is AGENTSTREAM_MAX_TOKENS_LIMIT"),
    ({"max_tokens": True}, "max_tokens must be an integer"),
    ({"max_tokens": 12.5}, "max_tokens must be an integer"),
    ({"temperature": -0.1}, "temperature must be a number from 0 to 2"),
    ({"temperature": float("nan")}, "temperature must be a number"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"top_p": 0}, "top_p must be a number above 0 and at most 1"),
    ({"top_p": 1.5}, "top_p must be a number above 0"),
    ({"stop": "END"}, "stop must be a list of strings"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop strings"),
    ({"stop": [""]}, "a stop string is empty"),
    ({"stop": [7]}, "stop string must be a string"),
    ({"seed": -1}, "seed must be an integer from 0 to 4294967295"),
    ({"seed": 2**32}, "seed must be an integer from 0"),
])
def test_generation_settings_out_of_bounds_are_refused_with_the_reason(given, reason):
    problem = _problem(**given)
    assert problem is not None and reason in problem, problem


def test_generation_settings_within_bounds_pass_and_the_bound_is_the_pipelines():
    assert _problem(max_tokens=4096, temperature=2, top_p=1, stop=["\n\n", "END"], seed=0) is None
    assert _problem(limit=100, max_tokens=101) is not None and _problem(limit=100, max_tokens=100) is None


# -- the run keeps them; every model request carries them ------------------------------------------------

def test_a_task_without_settings_gets_the_planners_defaults():
    request = _request(machine.start(_task(), [], NOW, generation=GenerationSettings(max_tokens=300)))
    assert (request.max_tokens, request.temperature, request.top_p, request.stop, request.seed) == (
        300, 0.0, None, [], None)
    assert _request(machine.start(_task(), [], NOW)).max_tokens == 256  # no settings given: today's default


def test_a_tasks_own_settings_go_into_every_model_request_of_its_run():
    task = _task(max_tokens=1024, temperature=0.7, top_p=0.9, stop=["END"], seed=42)
    state = machine.start(task, [], NOW, generation=GenerationSettings(max_tokens=300))
    assert state.sampling == Sampling(max_tokens=1024, temperature=0.7, top_p=0.9, stop=("END",), seed=42)
    reply = InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference",
                                     text="not an action", finish_reason="stop")
    state = machine.advance(state, reply, NOW)  # a second model step
    request = _request(state)
    assert request.step_id == "r:1:model"
    assert (request.max_tokens, request.temperature, request.top_p, request.stop, request.seed) == (
        1024, 0.7, 0.9, ["END"], 42)
    assert _request(RunState.from_json(state.to_json())) == request  # republished after a restart: the same


def test_a_state_recorded_before_these_settings_republishes_the_same_request():
    new_fields = {"sampling", "output_schema", "output", "output_failures", "output_retries"}
    state = machine.start(_task(), [], NOW)
    old = json.loads(state.to_json())
    assert not new_fields & set(old)  # at their defaults they are not written: old states keep their shape
    restored = RunState.from_json(old)
    assert restored.sampling == Sampling() and _request(restored) == _request(state)
    tuned = machine.start(_task(temperature=0.5, output_schema='{"type": "string"}'), [], NOW)
    assert {"sampling", "output_schema"} <= set(json.loads(tuned.to_json()))
    assert RunState.from_json(tuned.to_json()) == tuned


# -- what the engines get --------------------------------------------------------------------------------

def _generation(**kw: Any) -> GenerationRequest:
    return GenerationRequest(request_id="s", messages=(ChatMessage(role="user", content="hi"),), **kw)


def test_openai_compatible_servers_get_top_p_seed_and_stop_only_when_given():
    backend = OpenAIBackend(base_url="http://unused/v1", model="m")
    body = backend._body(_generation(max_tokens=99, temperature=0.5, top_p=0.8, seed=7, stop=("END",)))
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"], body["stop"]) == (
        99, 0.5, 0.8, 7, ["END"])
    assert not {"top_p", "seed", "stop"} & set(backend._body(_generation()))  # the server's defaults


def test_llamacpp_gets_top_p_seed_and_stop():
    pytest.importorskip("xllamacpp")
    from agentstream.services.inference.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(model_path="/unused.gguf")
    body = backend._body(_generation(max_tokens=99, temperature=0.5, top_p=0.8, seed=7, stop=("END",)))
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"], body["stop"]) == (
        99, 0.5, 0.8, 7, ["END"])
    assert not {"top_p", "seed", "stop"} & set(backend._body(_generation()))


async def test_the_scripted_model_ends_its_reply_at_a_stop_string():
    backend = ScriptedBackend()
    messages = (ChatMessage(role="user", content="[[answer:one. two. three.]]"),)
    items = [i async for i in backend.generate(GenerationRequest(request_id="s", messages=messages, stop=(" two",)))]
    final = items[-1]
    assert isinstance(final, Final) and final.text == '{"action": "final_answer", "answer": "one.'


class RecordingBackend(ScriptedBackend):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        self.requests.append(request)
        async for item in super().generate(request):
            yield item


class Ctx:
    def __init__(self) -> None:
        self.emitted: list[Event] = []

    async def emit(self, topic: str, event: Event, **_: Any) -> None:
        self.emitted.append(event)


def _inference(backend: ScriptedBackend) -> InferenceService:
    settings = Settings(kafka_bootstrap="fake:1", database_url="unused")
    runtime = SimpleNamespace(settings=settings, topics=Topics.of(settings), metrics=None, tracing=None, stages=None)
    return InferenceService(runtime, backend, token_flush_s=0.0)  # type: ignore[arg-type]


async def test_the_inference_service_hands_the_requests_settings_to_the_backend():
    backend = RecordingBackend()
    event = InferenceRequested.build(run_id="r", step="r:0:model", service="planner",
                                     messages=[Message(role="user", content="[[answer:hi]]")], max_tokens=77,
                                     temperature=0.3, top_p=0.5, stop=["END"], seed=9)
    await _inference(backend).handle(event, Ctx())  # type: ignore[arg-type]
    [request] = backend.requests
    assert (request.max_tokens, request.temperature, request.top_p, request.stop, request.seed) == (
        77, 0.3, 0.5, ("END",), 9)


async def test_a_long_final_answer_streams_as_tokens_like_any_other_reply():
    """Every model reply streams (services/inference/service.py), the final answer's included: its text
    arrives in many chunks whose concatenation is the reply the planner parses."""
    answer = " ".join(f"word{i}" for i in range(600))  # ~5,000 characters: over the old 2,000 cap
    event = InferenceRequested.build(run_id="r", step="r:3:model", service="planner",
                                     messages=[Message(role="user", content=f"[[answer:{answer}]]")])
    ctx = Ctx()
    await _inference(ScriptedBackend(chunk_chars=40)).handle(event, ctx)  # type: ignore[arg-type]
    chunks = [e for e in ctx.emitted if isinstance(e, TokenChunk)]
    [done] = [e for e in ctx.emitted if isinstance(e, InferenceCompleted)]
    assert len(chunks) > 100 and [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.step_id == "r:3:model" for c in chunks)
    streamed = "".join(c.text for c in chunks)
    assert streamed == done.text and parse_action(streamed).answer == answer


# -- the CLI's --output-schema ---------------------------------------------------------------------------

def test_output_schema_option_reads_a_file_or_takes_json_and_refuses_anything_else(tmp_path: Path):
    schema = tmp_path / "city.json"
    schema.write_text('{"type": "object"}')
    assert _schema_option(str(schema)) == '{"type": "object"}'
    assert _schema_option(' {"type": "string"}') == ' {"type": "string"}'
    assert _schema_option(None) is None
    with pytest.raises(typer.BadParameter, match=r"no file 'nope\.json', and not a JSON object"):
        _schema_option("nope.json")
