"""How the inference service answers each kind of backend error: an error result for a request that
fails, an outage wait for a model server that is away, and for an engine that died, a stopped service
(unready; the worker exits for its supervisor) that leaves the request to the partition's next owner."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from agentstream.services.inference.backends.base import Delta, Final, GenerationRequest
from agentstream.services.inference.service import InferenceService
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import BackendError
from agentstream.streams.core.events import Event, InferenceCompleted, InferenceRequested, Message
from agentstream.streams.core.outages import outage_of
from agentstream.streams.core.signals import Abandoned
from agentstream.streams.kafka.topics import Topics


class FailingBackend:
    name = "failing"
    slots = 2

    def __init__(self, error: BackendError) -> None:
        self.error = error

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        raise self.error
        yield Delta("")  # an async generator, as the protocol says


class Ctx:
    def __init__(self) -> None:
        self.emitted: list[Event] = []

    async def emit(self, topic: str, event: Event, **_: Any) -> None:
        self.emitted.append(event)


def _service(error: BackendError) -> InferenceService:
    """The service on a stand-in runtime (what ``service()`` and ``handle`` read; nothing connects)."""
    settings = Settings(kafka_bootstrap="fake:1", database_url="unused")
    runtime = SimpleNamespace(settings=settings, topics=Topics.of(settings), metrics=None, tracing=None,
                              stages=None)
    return InferenceService(runtime, FailingBackend(error))  # type: ignore[arg-type]


def _event() -> InferenceRequested:
    return InferenceRequested.build(run_id="r1", step="s1", service="planner",
                                    messages=[Message(role="user", content="hi")])


async def test_a_dead_engine_stops_the_service_and_abandons_the_request() -> None:
    inference = _service(BackendError("the engine is dead: CUDA error: ...", fatal=True))
    runner = inference.service()
    ctx = Ctx()
    with pytest.raises(Abandoned, match="the model engine died"):
        await inference.handle(_event(), ctx)  # type: ignore[arg-type]
    assert runner.stopping and ctx.emitted == []  # unready; no error result: the run is not failed for it


async def test_a_failed_request_gets_an_error_result_and_the_service_goes_on() -> None:
    inference = _service(BackendError("the conversation does not fit"))
    runner = inference.service()
    ctx = Ctx()
    await inference.handle(_event(), ctx)  # type: ignore[arg-type]
    [result] = ctx.emitted
    assert isinstance(result, InferenceCompleted) and result.error == "the conversation does not fit"
    assert not runner.stopping


async def test_a_model_server_outage_is_raised_for_the_runtime_to_wait_out() -> None:
    error = BackendError("503 from the model server", retriable=True)
    inference = _service(error)
    runner = inference.service()
    with pytest.raises(BackendError) as raised:
        await inference.handle(_event(), Ctx())  # type: ignore[arg-type]
    assert outage_of(raised.value) == "model" and not runner.stopping


def test_fatal_is_never_an_outage() -> None:
    error = BackendError("dead", retriable=True, fatal=True)
    assert error.fatal and not error.retriable and outage_of(error) is None
