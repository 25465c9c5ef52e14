"""Prometheus metrics of the records a service handles (``streams/telemetry/metrics.py``), on label
children created once per service. Installed only with metrics on (``Runtime.metrics``).

``RecordMetrics`` (outermost, once per record): the queue wait, the handling time by event type of each
record handled, the duplicates dropped. ``AttemptMetrics`` (inside ``Recover``, once per attempt): the
handler errors, retried or not. The policy counts what it decides itself: retries (``Recover``) and
dead letters by kind (``Rejector``).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from agentstream.streams.core.signals import Abandoned, Deferred
from agentstream.streams.runtime.middleware.chain import Delivery, Next

if TYPE_CHECKING:  # prometheus-client is the [worker] extra
    from agentstream.streams.telemetry.metrics import ServiceMetrics


class RecordMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        metrics = self.metrics
        wait = delivery.queue_wait
        metrics.queue_wait.observe(wait if wait > 0 else 0.0)
        await call_next(delivery)
        if delivery.done:
            metrics.handled(delivery.event_type).observe(time.perf_counter() - delivery.started)
        elif delivery.duplicate:
            metrics.duplicates.inc()


class AttemptMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        try:
            await call_next(delivery)
        except (asyncio.CancelledError, Abandoned, Deferred):
            raise
        except Exception:
            self.metrics.errors.inc()
            raise


__all__ = ["AttemptMetrics", "RecordMetrics"]
