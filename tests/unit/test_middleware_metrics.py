"""The metrics middlewares (streams/runtime/middleware/metrics.py): per record, the queue wait, the
handling time by event type of a record handled, and the duplicates dropped; per attempt, the handler
errors — not the flow-control signals, which are not errors."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from agentstream.streams.core.signals import Abandoned, Deferred
from agentstream.streams.runtime.middleware.chain import Delivery, Next, compose
from agentstream.streams.runtime.middleware.metrics import AttemptMetrics, RecordMetrics
from agentstream.streams.telemetry.metrics import Metrics

from .middleware_kit import End, delivery


def _text(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


async def _outcome(d: Delivery, call_next: Next) -> None:
    await call_next(d)
    d.done = d.record.offset == 1
    d.duplicate = d.record.offset == 2


async def test_each_record_observes_its_wait_and_a_handled_one_its_time():
    metrics = Metrics(process=False)
    chain = compose([RecordMetrics(metrics.service("svc")), _outcome], End())
    for offset in (1, 2, 3):  # handled, a duplicate, neither (dead-lettered, say)
        await chain(delivery(offset=offset))
    text = _text(metrics)
    assert 'agentstream_queue_wait_seconds_count{service="svc"} 3.0' in text
    assert 'agentstream_handle_seconds_count{event_type="TaskSubmitted",service="svc"} 1.0' in text
    assert 'agentstream_duplicates_total{service="svc"} 1.0' in text


async def test_a_record_that_raises_observes_no_handling_time():
    metrics = Metrics(process=False)
    d = delivery()
    d.done = True
    with pytest.raises(Deferred):
        await compose([RecordMetrics(metrics.service("svc"))], End(lambda _n: Deferred("later")))(d)
    assert 'agentstream_handle_seconds_count{event_type="TaskSubmitted",service="svc"}' not in _text(metrics)


@pytest.mark.parametrize("error, counted", [(ValueError("bad"), 1), (Deferred("later"), 0),
                                            (Abandoned("moved"), 0)])
async def test_every_failed_attempt_counts_as_a_handler_error(error, counted):
    metrics = Metrics(process=False)
    with pytest.raises(type(error)):
        await compose([AttemptMetrics(metrics.service("svc"))], End(lambda _n: error))(delivery())
    assert f'agentstream_handler_errors_total{{service="svc"}} {counted}.0' in _text(metrics)
