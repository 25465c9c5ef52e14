"""Stage timing: where a record's time goes, for ``bench/perf/pipeline.py --breakdown``
(``streams/telemetry/stages.py``). Installed only when the process has a stage clock
(``AGENTSTREAM_STAGES_DIR``, read once at start: ``Runtime.stages``); otherwise the chain has none of it.

A record's stages, each ``{service}.{stage}``, are measured at four places of the chain, so one
``StageTiming`` hands out four middlewares:

- ``record`` (outermost): ``deliver`` (broker timestamp to fetched), ``queue`` (fetched to handling),
  and ``done`` (handling began to done: handled and acknowledged);
- ``decoded`` (right after ``Decode``): ``decode``;
- ``acked`` (around ``Publish``): ``ack``, the handler's return to its outputs acknowledged;
- ``handled`` (around the handler): ``handle``, and ``to_send`` (to the first event that carries the
  run on: ``Context.time_first_send``).

A forwarded record (``RouteByRun``) has ``deliver``, ``queue``, ``decode`` and ``done`` only.
"""

from __future__ import annotations

import time

from agentstream.streams.runtime.middleware.chain import Delivery, Next
from agentstream.streams.telemetry.stages import StageClock


class StageTiming:
    """The stage-timing middlewares of one service, recording into ``clock``."""

    def __init__(self, clock: StageClock, service: str) -> None:
        self.clock = clock
        self.record = _RecordStages(clock, service)
        self.decoded = _DecodeStage(clock, service)
        self.acked = _AckStage(clock, service)
        self.handled = _HandleStage(clock, service)


class _RecordStages:
    def __init__(self, clock: StageClock, service: str) -> None:
        self.clock = clock
        self.deliver, self.queue, self.done = f"{service}.deliver", f"{service}.queue", f"{service}.done"

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        clock = self.clock
        consumed = delivery.record.consumed_at.timestamp()
        clock.add(self.deliver, consumed - delivery.record.timestamp_ms / 1000, at=consumed)
        clock.add(self.queue, time.time() - consumed)
        await call_next(delivery)
        if delivery.done:
            clock.since(self.done, delivery.started)


class _DecodeStage:
    def __init__(self, clock: StageClock, service: str) -> None:
        self.clock = clock
        self.stage = f"{service}.decode"

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        self.clock.since(self.stage, delivery.started)
        await call_next(delivery)


class _AckStage:
    def __init__(self, clock: StageClock, service: str) -> None:
        self.clock = clock
        self.stage = f"{service}.ack"

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        await call_next(delivery)  # the handler (``_HandleStage`` notes when it returned), then the acks
        self.clock.since(self.stage, delivery.handled_at)


class _HandleStage:
    def __init__(self, clock: StageClock, service: str) -> None:
        self.clock = clock
        self.stage = f"{service}.handle"

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        if delivery.ctx is not None:
            delivery.ctx.time_first_send(self.clock)
        handling = time.perf_counter()
        await call_next(delivery)
        self.clock.since(self.stage, handling)
        delivery.handled_at = time.perf_counter()


__all__ = ["StageTiming"]
