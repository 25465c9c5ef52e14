"""The failure policy (streams/runtime/middleware/retry.py): retriable errors are retried with backoff
up to ``max_attempts`` and then dead-lettered as ``retries_exhausted``, others at once as
``handler_error``; an outage is waited out with the partition held, its tries free while the
dependency's probe fails; flow-control signals pass through untouched."""

from __future__ import annotations

import pytest

from agentstream.streams.core.errors import Unavailable
from agentstream.streams.core.signals import Abandoned, Deferred
from agentstream.streams.runtime import failures, records
from agentstream.streams.runtime.failures import PartitionHolds
from agentstream.streams.runtime.middleware.chain import compose
from agentstream.streams.runtime.middleware.retry import Recover
from agentstream.streams.runtime.records import RetryPolicy, ServiceConfig
from agentstream.streams.telemetry.metrics import Metrics

from .middleware_kit import End, Letters, delivery, stats

CONFIG = ServiceConfig(name="svc", topics=["t.in"], group_id="g", outage_backoff_s=0.003,
                       retry=RetryPolicy(max_attempts=3, backoff_s=0.001, max_backoff_s=0.002))


@pytest.fixture(autouse=True)
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float]]:
    """Every backoff asked for, as ``(attempt, cap_s)`` (the cap tells a retry from an outage round)."""
    calls: list[tuple[int, float]] = []

    def backoff(attempt: int, *, base_s: float, cap_s: float) -> float:
        calls.append((attempt, cap_s))
        return 0.0

    monkeypatch.setattr(records, "backoff", backoff)
    monkeypatch.setattr(failures, "backoff", backoff)
    return calls


def _recover(probes=None, metrics=None):
    letters, counts = Letters(), stats()
    holds = PartitionHolds(CONFIG, dict(probes or {}))
    return Recover("svc", CONFIG.retry, holds, letters, counts, metrics), holds, letters, counts  # type: ignore[arg-type]


async def test_a_retriable_error_is_retried_then_handled(backoffs):
    recover, _, letters, counts = _recover()
    end = End(lambda n: Unavailable("busy") if n < 3 else None)
    d = delivery()
    await compose([recover], end)(d)
    assert len(end.calls) == 3 and d.attempt == 3 and d.done and d.failure is None
    assert backoffs == [(1, 0.002), (2, 0.002)] and letters.sent == []
    assert (counts["retries"], counts["processed"]) == (2, 1)


async def test_retries_run_out_then_it_is_dead_lettered():
    metrics = Metrics(process=False)
    recover, _, letters, counts = _recover(metrics=metrics.service("svc"))
    d = delivery()
    await compose([recover], End(lambda _n: Unavailable("still busy")))(d)
    assert letters.sent == [(7, "retries_exhausted", "Unavailable: still busy", "r")]
    assert not d.done and d.failure == "retries_exhausted: Unavailable: still busy"
    assert (counts["retries"], counts["processed"]) == (2, 1)
    assert metrics.retries.labels("svc")._value.get() == 2


async def test_an_error_that_is_not_retriable_is_dead_lettered_at_once():
    recover, _, letters, _ = _recover()
    end = End(lambda _n: ValueError("bad payload"))
    await compose([recover], end)(delivery())
    assert len(end.calls) == 1 and letters.sent == [(7, "handler_error", "ValueError: bad payload", "r")]


async def test_an_outage_is_waited_out_with_the_partition_held_and_its_tries_are_free(backoffs):
    recover, holds, letters, counts = _recover()  # no probe: every round is free
    d = delivery()
    held = []

    def down(n: int) -> BaseException | None:
        held.append(dict(holds.held))
        return ConnectionRefusedError("database refused") if n <= 4 else None

    await compose([recover], End(down))(d)
    assert held == [{}, {d.tp: 1}, {d.tp: 1}, {d.tp: 1}, {d.tp: 1}] and holds.held == {} and not holds.outages
    assert d.done and d.attempt == 1 and letters.sent == []
    assert backoffs == [(1, 0.003), (2, 0.003), (3, 0.003), (4, 0.003)]
    assert (counts["outage_retries"], counts["retries"]) == (4, 0)


async def test_while_the_probe_answers_an_outage_error_counts_as_an_attempt(backoffs):
    async def probe() -> None:
        return None

    recover, _, letters, counts = _recover({"database": probe})
    await compose([recover], End(lambda _n: ConnectionRefusedError("refused")))(delivery())
    assert letters.sent == [(7, "retries_exhausted", "ConnectionRefusedError: refused", "r")]
    # round 1 is free; from round 2 the probe answers: each try counts (retry backoffs capped at 0.002)
    assert backoffs == [(1, 0.003), (2, 0.003), (1, 0.002), (3, 0.003), (2, 0.002), (4, 0.003)]
    assert (counts["outage_retries"], counts["retries"]) == (4, 2)


@pytest.mark.parametrize("signal", [Deferred("later"), Abandoned("moved")])
async def test_flow_control_signals_are_not_failures(signal):
    recover, _, letters, counts = _recover()
    with pytest.raises(type(signal)):
        await compose([recover], End(lambda _n: signal))(delivery())
    assert letters.sent == [] and counts["processed"] == 0
