"""Stopping an aiokafka consumer whose last fetch failed.

aiokafka's ``AIOKafkaConsumer.stop()`` cancels the fetch task and awaits it; when that task was in its
retry back-off after a failed fetch (a ``RequestTimedOutError`` from a broker or an event loop that
stalled past ``request_timeout_ms``), the ``CancelledError`` it was given escapes ``stop()`` itself. A
shutdown must not fail, or look cancelled, because of the last fetch: the records it would have
returned are fetched again by whoever reads next (offsets are committed separately)."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


async def stop_consumer(consumer: AIOKafkaConsumer, what: str) -> None:
    """``consumer.stop()``, but a failed or cancelled last fetch is logged, not raised. A cancellation
    of the caller itself still propagates."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("%s: its last fetch was cancelled while failing; stopped anyway", what)
    except KafkaError as exc:
        log.warning("%s: stopping raised %r; stopped anyway", what, exc)
