"""Route by run (streams/runtime/middleware/routing.py): an event on another partition than its run's,
or not keyed by its run id, is forwarded to its run's partition, unchanged but for its key and a header
saying where it came from; the rest goes on to the handler."""

from __future__ import annotations

from agentstream.streams.runtime.headers import ROUTED_HEADER
from agentstream.streams.runtime.middleware.chain import compose
from agentstream.streams.runtime.middleware.routing import Forward, RouteByRun

from .fakes import FakeKafka
from .middleware_kit import End, delivery, runtime, stats, task


async def test_a_record_on_its_runs_partition_keyed_by_its_run_goes_on():
    rt = await runtime()
    right = rt.topics.partition_for("run-x")
    d = delivery(task("run-x:0"), key=b"run-x", partition=right)
    end = End()
    await compose([RouteByRun(rt), Forward("svc", rt, stats())], end)(d)
    assert not d.misrouted and end.calls == [d]


async def test_elsewhere_or_keyed_otherwise_it_is_forwarded():
    kafka = FakeKafka()
    rt = await runtime(kafka)
    right = rt.topics.partition_for("run-x")
    cases = [(b"run-x", (right + 1) % 4), (None, right), (b"other", right)]
    for key, partition in cases:
        counts, end = stats(), End()
        d = delivery(task("run-x:0"), key=key, partition=partition, headers={"x-theirs": b"1"})
        await compose([RouteByRun(rt), Forward("svc", rt, counts)], end)(d)
        assert d.misrouted and end.calls == [] and counts["routed"] == 1
        sent = kafka.produced[-1]
        assert (sent.topic, sent.value, sent.key, sent.partition) == (d.record.topic, d.value, b"run-x", right)
        assert sent.headers == [("x-theirs", b"1"), (ROUTED_HEADER, f"t.in:{partition}:7".encode())]
