"""The failure policy of a handler (``ServiceConfig.retry``, ``streams/core/outages.py``): each attempt
runs the rest of the chain, and when it raises

- an outage (PostgreSQL, the broker or the model server unreachable: ``outage_of``) is not a failure:
  the record is tried again with capped backoff for as long as the outage lasts, its partition held
  (``PartitionHolds``) and readiness saying so; tries made while the dependency's probe fails do not
  count towards ``RetryPolicy.max_attempts``;
- an error that says it is retriable (``is_retriable``, a ``KafkaError``), or an outage whose probe
  answers, is retried with backoff up to ``max_attempts``, then dead-lettered as ``retries_exhausted``;
- any other error is dead-lettered at once as ``handler_error``.

``Deferred``, ``Abandoned`` and a cancellation are not failures: they go up to the consumer loop. A
record dead-lettered counts as processed, but not as done (``Delivery.done``): its id is not remembered,
so a re-driven copy (``agentstream dlq redrive``) is handled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError

from agentstream.streams.core.kinds import DeadLetterKind
from agentstream.streams.core.outages import Outage, outage_of
from agentstream.streams.core.signals import Abandoned, Deferred
from agentstream.streams.runtime.failures import PartitionHolds, Rejector
from agentstream.streams.runtime.middleware.chain import Delivery, Next
from agentstream.streams.runtime.records import RetryPolicy, is_retriable

if TYPE_CHECKING:  # prometheus-client is the [worker] extra
    from agentstream.streams.telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)


class Recover:
    def __init__(self, service: str, policy: RetryPolicy, holds: PartitionHolds, reject: Rejector,
                 stats: MutableMapping[str, int], metrics: ServiceMetrics | None = None) -> None:
        self.service = service
        self.policy = policy
        self.holds = holds
        self.reject = reject
        self.stats = stats
        self.metrics = metrics

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        event = delivery.event
        outage_rounds = 0
        outage: Outage | None = None
        try:
            while True:
                try:
                    await call_next(delivery)
                    break
                except (asyncio.CancelledError, Abandoned, Deferred):
                    raise
                except Exception as exc:
                    dependency = outage_of(exc)
                    if dependency is not None:
                        if outage is None:
                            outage = self.holds.hold(delivery.tp, dependency, exc)
                            log.warning("%s: %s is unavailable (%s: %s); %s waits for it, its partition paused",
                                        self.service, dependency, type(exc).__name__, exc, event.step_id)
                        outage_rounds += 1
                        self.stats["outage_retries"] += 1
                        if not await self.holds.wait_out(dependency, outage_rounds):
                            continue  # the dependency is still down: this try does not count
                    retriable = dependency is not None or is_retriable(exc) or isinstance(exc, KafkaError)
                    if retriable and delivery.attempt < self.policy.max_attempts:
                        self.stats["retries"] += 1
                        if self.metrics is not None:
                            self.metrics.retries.inc()
                        log.info("%s: retrying %s (attempt %d): %s", self.service, event.step_id, delivery.attempt,
                                 exc)
                        await asyncio.sleep(self.policy.delay(delivery.attempt))
                        delivery.attempt += 1
                        continue
                    kind: DeadLetterKind = "retries_exhausted" if retriable else "handler_error"
                    log.exception("%s: %s on %s", self.service, kind, event.step_id)
                    delivery.failure = f"{kind}: {type(exc).__name__}: {exc}"
                    await self.reject(delivery.record, delivery.value, kind, f"{type(exc).__name__}: {exc}",
                                      run_id=event.run_id)
                    self.stats["processed"] += 1
                    return
        finally:
            if outage is not None:
                self.holds.release(delivery.tp, outage)
                log.info("%s: %s went on after %d tries during the %s outage", self.service, event.step_id,
                         outage_rounds, outage.dependency)
        delivery.done = True
        self.stats["processed"] += 1


__all__ = ["Recover"]
