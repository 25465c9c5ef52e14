"""Stage timing (streams/runtime/middleware/stages.py) records a record's stages into the clock it is
given, and is not there at all unless the process has a clock: ``AGENTSTREAM_STAGES_DIR`` is read once,
when the process's clock is first asked for (``Runtime`` does at construction), never per record."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import Event
from agentstream.streams.runtime.middleware.chain import Delivery, compose
from agentstream.streams.runtime.middleware.publish import Publish
from agentstream.streams.runtime.middleware.stages import StageTiming
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner
from agentstream.streams.telemetry import stages
from agentstream.streams.telemetry.stages import ProcessStages, StageClock

from .fakes import FakeKafka
from .middleware_kit import CODEC, TOPIC, End, delivery, runtime, task


async def _context(d: Delivery, call_next) -> None:
    """What ``Publish`` does first: a context for the attempt."""
    d.ctx = Context(None, "svc", d.record)  # type: ignore[arg-type]
    await call_next(d)


def _chain(timing: StageTiming, end: Callable[[Delivery], object]):
    """The stage placements as the runner puts them, around stand-ins for the steps between them."""
    async def decode_and_recover(d: Delivery) -> None:
        await compose([timing.decoded], compose([timing.acked, _context, timing.handled], end))(d)
        d.done = True

    return compose([timing.record], decode_and_recover)


async def test_a_handled_record_has_every_stage(tmp_path):
    clock = StageClock(tmp_path)
    d = delivery()
    await _chain(StageTiming(clock, "svc"), End())(d)
    assert set(clock.samples) == {"svc.deliver", "svc.queue", "svc.decode", "svc.handle", "svc.ack", "svc.done"}
    assert all(len(v) == 1 for v in clock.samples.values())
    assert d.handled_at > d.started


async def test_a_failed_handler_has_no_handle_ack_or_done(tmp_path):
    clock = StageClock(tmp_path)
    with pytest.raises(ValueError):
        await _chain(StageTiming(clock, "svc"), End(lambda _n: ValueError("no")))(delivery())
    assert set(clock.samples) == {"svc.deliver", "svc.queue", "svc.decode"}


async def test_the_first_event_that_carries_the_run_on_is_timed(tmp_path):
    clock = StageClock(tmp_path)
    kafka = FakeKafka()
    rt = await runtime(kafka)

    async def emit(d: Delivery) -> None:
        assert d.ctx is not None
        await d.ctx.emit(rt.topics.tokens, task("r:1"))  # not on the critical path: not timed
        await d.ctx.emit(rt.topics.tasks, task("r:2"))
        await d.ctx.emit(rt.topics.tasks, task("r:3"))  # only the first

    timing = StageTiming(clock, "svc")
    await compose([Publish("svc", rt), timing.handled], emit)(delivery())
    assert len(clock.samples["svc.to_send"]) == 1 and len(kafka.produced) == 3


async def _handle_one(rt) -> list[Event]:
    handled: list[Event] = []

    async def handler(event: Event, ctx: Context) -> None:
        handled.append(event)

    runner = ServiceRunner(rt, ServiceConfig(name="svc", topics=[TOPIC], group_id="g"), handler)
    d = delivery()
    await runner._handle(d.tp, d.record, d.value)
    return handled


async def test_the_runner_times_stages_only_with_a_clock(tmp_path):
    clock = StageClock(tmp_path)
    assert len(await _handle_one(await runtime(stages=clock))) == 1
    assert {"svc.deliver", "svc.decode", "svc.handle", "svc.done"} <= set(clock.samples)
    assert len(await _handle_one(await runtime(stages=None))) == 1  # and nothing to record into


def test_the_environment_is_read_once(monkeypatch, tmp_path):
    monkeypatch.setattr(stages.atexit, "register", lambda _f: None)  # no file written at the end of the tests
    monkeypatch.delenv(stages.ENV, raising=False)
    off = ProcessStages()
    assert off.clock() is None
    monkeypatch.setenv(stages.ENV, str(tmp_path / "stages"))
    assert off.clock() is None  # decided already
    on = ProcessStages()
    clock = on.clock()
    assert clock is not None and clock.directory == tmp_path / "stages" and clock.directory.is_dir()
    monkeypatch.delenv(stages.ENV)
    assert on.clock() is clock


async def test_a_runtime_takes_the_processes_clock_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.setattr(stages.atexit, "register", lambda _f: None)
    monkeypatch.setenv(stages.ENV, str(tmp_path))
    monkeypatch.setattr(stages, "PROCESS", ProcessStages())
    rt = Runtime(Settings(kafka_bootstrap="fake:1", database_url="unused"), CODEC, tracing=None)
    await rt.producer.stop()  # never started: closes it
    assert rt.stages is not None and rt.stages is stages.PROCESS.clock()
    assert (await runtime(stages=None)).stages is None
