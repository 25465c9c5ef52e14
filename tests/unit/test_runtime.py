# ruff: noqa: F811  (pytest fixtures imported from runtime_kit are test arguments of the same name)
"""The consumer runtime (streams/runtime/runner.py and its middlewares) driven by an in-memory consumer and
producer (tests/unit/fakes.py).

What is proved here, with no broker: records of one key are handled in order while other keys run
concurrently (within ``concurrency``); a partition is paused while one of its records waits out an
outage, or while too much is in flight, and resumed afterwards; offsets are committed only up to the
highest contiguous finished record, and a record is finished only once what it emitted is acknowledged;
a revoked partition's unfinished records (cancelled after the grace, or ``Abandoned``) are neither
committed nor dead-lettered, and the next owner gets them; a retriable error is retried with backoff,
a failed record goes to the dead-letter topic with its reason while the service carries on, and a record
that cannot be dead-lettered stops the service without committing past it.

Waiting is done with ``until`` (polls a condition; its time limit only turns a hang into a failure).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from aiokafka import TopicPartition

from agentstream.streams.core.events import (
    Event,
)
from agentstream.streams.runtime.headers import SOURCE_HEADER
from agentstream.streams.runtime.records import Context, RetryPolicy

from .runtime_kit import TOPIC, TP0, TP1, Handler, Service, backoffs, codec, kafka, produce, task, until  # noqa: F401  (fixtures, backoffs autouse; tests take them as arguments)


async def test_records_of_one_key_are_handled_in_order_while_other_keys_run(kafka, codec):
    handler = Handler()
    release_a0 = handler.gate("a:0")
    produce(kafka, codec, 0, "a:0", "b:0", "a:1", "c:0", "b:1", "a:2")
    async with Service(kafka, codec, handler, concurrency=4) as svc:
        await until(lambda: handler.ended("b:0", "b:1", "c:0"), "b and c to be handled while a:0 is held")
        assert not handler.started("a:1")  # a's later records wait for a:0
        assert handler.started("a:0") and not handler.ended("a:0")
        release_a0.set()
        await until(lambda: handler.ended("a:0", "a:1", "a:2"))
    for key, n in (("a", 3), ("b", 2), ("c", 1)):
        assert handler.for_key(key) == [f"{what} {key}:{i}" for i in range(n) for what in ("start", "end")]
    assert svc.runner.stats["processed"] == 6
    assert kafka.committed == {TP0: 6}


async def test_no_more_than_concurrency_handlers_run_at_once(kafka, codec):
    handler = Handler()
    release = handler.gate("a:0", "b:0", "c:0", "d:0", "e:0")
    produce(kafka, codec, 0, "a:0", "b:0", "c:0", "d:0", "e:0")
    async with Service(kafka, codec, handler, concurrency=2):
        await until(lambda: handler.active == 2)
        for _ in range(20):
            await asyncio.sleep(0)
        assert handler.active == 2 and len(handler.calls) == 2
        release.set()
        await until(lambda: handler.ended("a:0", "b:0", "c:0", "d:0", "e:0"))
    assert handler.peak == 2


async def test_records_sharing_an_order_key_wait_for_each_other_whatever_their_keys(kafka, codec):
    """``ServiceConfig.order_keys``: the planner orders a session's tasks (different runs) by the session."""
    handler = Handler()
    release_a0 = handler.gate("a:0")
    for step, group in (("a:0", b"g"), ("b:0", b"g"), ("c:0", None)):
        event = task(step)
        kafka.append(TOPIC, 0, codec.encode(event), key=event.run_id.encode(),
                     headers=(("grp", group),) if group else ())
    async with Service(kafka, codec, handler, concurrency=4,
                       order_keys=lambda r: [r.headers["grp"]] if "grp" in r.headers else []):
        await until(lambda: handler.ended("c:0"), "c (no order key) to be handled while a:0 is held")
        assert handler.started("a:0") and not handler.started("b:0")  # b waits for a: same order key
        release_a0.set()
        await until(lambda: handler.ended("a:0", "b:0"))
    assert handler.log.index("end a:0") < handler.log.index("start b:0")


# -- commits -----------------------------------------------------------------------------------

async def test_the_committed_offset_never_passes_an_unfinished_record(kafka, codec):
    """Records 0..4 where 2 finishes last: the commit is 2 until 2 is done, then 5. (The commit loop is
    kept out of the way; ``_commit`` is what it calls.)"""
    handler = Handler()
    release = handler.gate("k2:0")
    produce(kafka, codec, 0, "k0:0", "k1:0", "k2:0", "k3:0", "k4:0")
    async with Service(kafka, codec, handler, commit_interval_s=3600) as svc:
        await until(lambda: handler.ended("k0:0", "k1:0", "k3:0", "k4:0"))
        await svc.runner._commit()
        assert kafka.commits == [{TP0: 2}]
        await svc.runner._commit()
        assert kafka.commits == [{TP0: 2}]  # nothing new
        release.set()
        await until(lambda: handler.ended("k2:0"))
        await until(lambda: svc.runner.tracker.in_flight == 0)
        await svc.runner._commit()
        assert kafka.commits == [{TP0: 2}, {TP0: 5}]
    assert kafka.commits == [{TP0: 2}, {TP0: 5}]  # the final commit at shutdown had nothing to add


class Emitter(Handler):
    async def act(self, event: Event, ctx: Context) -> None:
        await ctx.emit("t.out", task(event.run_id + ":1"))


async def test_a_record_is_done_only_once_what_it_emitted_is_acknowledged(kafka, codec):
    kafka.hold_acks = True
    handler = Emitter()
    produce(kafka, codec, 0, "e:0")
    async with Service(kafka, codec, handler, commit_interval_s=3600) as svc:
        await until(lambda: handler.ended("e:0"))
        for _ in range(20):
            await asyncio.sleep(0)
        await svc.runner._commit()
        assert kafka.commits == [] and svc.runner.stats["processed"] == 0
        kafka.ack_all()
        await until(lambda: svc.runner.stats["processed"] == 1)
        await svc.runner._commit()
        assert kafka.commits == [{TP0: 1}]
    [out] = kafka.produced
    assert (out.topic, out.key) == ("t.out", b"e")
    assert dict(out.headers)[SOURCE_HEADER].decode().startswith(f"{TOPIC}:0:0:")


# -- pausing -----------------------------------------------------------------------------------

async def test_a_partition_waiting_out_an_outage_is_paused_then_resumed(kafka, codec):
    """While a:0 fails because the database is down, partition 0 is paused (b:0, appended meanwhile,
    is not fetched) and partition 1 flows; outage tries do not count (max_attempts=1), and once the
    database is back a:0 is handled, the partition resumed and b:0 handled after it."""
    handler = Handler()
    database_down = True
    handler.fail["a:0"] = lambda _n: ConnectionRefusedError("database refused") if database_down else None
    produce(kafka, codec, 0, "a:0")
    async with Service(kafka, codec, handler, retry=RetryPolicy(max_attempts=1, backoff_s=0.001)) as svc:
        await until(lambda: TP0 in svc.consumer.paused(), "partition 0 to be paused")
        assert svc.runner.outages and "database unavailable" in svc.runner.outages.describe()
        produce(kafka, codec, 0, "b:0")
        produce(kafka, codec, 1, "c:0")
        await until(lambda: handler.ended("c:0"), "partition 1 to flow during the outage")
        assert not handler.started("b:0") and not handler.ended("a:0")
        database_down = False
        await until(lambda: handler.ended("a:0", "b:0"))
        assert not svc.runner.outages
    assert handler.log.index("end a:0") < handler.log.index("start b:0")
    assert svc.consumer.pauses == [{TP0}] and svc.consumer.resumes == [{TP0}]
    stats = svc.runner.stats
    assert handler.calls["a:0"] >= 2 and stats["outage_retries"] == handler.calls["a:0"] - 1
    assert (stats["retries"], stats["dead_lettered"], stats["processed"]) == (0, 0, 3)
    assert kafka.produced == []
    assert kafka.committed == {TP0: 2, TP1: 1}


async def test_an_outage_error_while_the_dependency_answers_counts_and_is_dead_lettered(kafka, codec, backoffs):
    """The first outage round is free; from the second, the probe answers, so each try counts."""
    handler = Handler()
    handler.fail["x:0"] = lambda _n: ConnectionRefusedError("refused")
    probes = []

    async def probe() -> None:
        probes.append(1)

    produce(kafka, codec, 0, "x:0")
    retry = RetryPolicy(max_attempts=2, backoff_s=0.001, max_backoff_s=0.002)
    async with Service(kafka, codec, handler, retry=retry, runner_kw={"probes": {"database": probe}}) as svc:
        await until(lambda: svc.runner.stats["dead_lettered"] == 1)
    assert handler.calls["x:0"] == 3 and len(probes) == 2
    assert backoffs == [(1, 0.001, 0.003), (2, 0.001, 0.003), (1, 0.001, 0.002), (3, 0.001, 0.003)]
    [letter] = svc.letters()
    assert (letter.error_kind, letter.reason) == ("retries_exhausted", "ConnectionRefusedError: refused")
    assert (svc.runner.stats["outage_retries"], svc.runner.stats["retries"]) == (3, 1)
    assert not svc.runner.outages
    assert kafka.committed == {TP0: 1}


async def test_too_much_in_flight_pauses_every_partition_until_it_drains(kafka, codec):
    handler = Handler()
    release = handler.gate("a:0", "b:0", "c:0", "d:0")
    produce(kafka, codec, 0, "a:0", "b:0", "c:0")
    produce(kafka, codec, 1, "d:0")
    async with Service(kafka, codec, handler, max_in_flight=2) as svc:
        await until(lambda: svc.consumer.paused() == {TP0, TP1}, "both partitions to be paused")
        produce(kafka, codec, 0, "f:0")
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert not handler.started("f:0")
        release.set()
        await until(lambda: handler.ended("a:0", "b:0", "c:0", "d:0", "f:0"))
    assert svc.consumer.pauses == [{TP0, TP1}] and svc.consumer.resumes == [{TP0, TP1}]
    assert kafka.committed == {TP0: 4, TP1: 1}


# -- revocation --------------------------------------------------------------------------------

async def test_a_revoked_partitions_unfinished_record_is_cancelled_uncommitted_and_redone_by_its_next_owner(
        kafka, codec):
    handler = Handler()
    release_b0 = handler.gate("b:0")
    revoked: list[set[TopicPartition]] = []
    assigned: list[set[TopicPartition]] = []

    async def on_revoked(tps: set[TopicPartition]) -> None:
        revoked.append(tps)

    async def on_assigned(tps: set[TopicPartition]) -> None:
        assigned.append(tps)

    produce(kafka, codec, 0, "a:0", "b:0", "c:0")
    produce(kafka, codec, 1, "d:0")
    hooks = {"on_revoked": on_revoked, "on_assigned": on_assigned}
    async with Service(kafka, codec, handler, shutdown_grace_s=0.02, runner_kw=hooks) as svc:
        await until(lambda: handler.ended("a:0", "c:0", "d:0") and handler.started("b:0"))
        await svc.consumer.rebalance({TP1})  # partition 0 goes to another member
        assert "cancelled b:0" in handler.log and not handler.ended("b:0")
        assert kafka.committed == {TP0: 1, TP1: 1}
        assert max(kafka.commits_for(TP0)) == 1  # never past b:0
        assert revoked == [{TP0, TP1}] and assigned == [{TP0, TP1}, {TP1}]
        assert svc.runner.tracker.in_flight == 0 and kafka.produced == []
        produce(kafka, codec, 1, "e:0")
        await until(lambda: handler.ended("e:0"), "the partition kept to flow")
        # Partition 0 comes back (as to its next owner): from the committed offset, b:0 is redone and
        # c:0, already handled here, is dropped as a duplicate.
        release_b0.set()
        await svc.consumer.rebalance({TP0, TP1})
        await until(lambda: handler.ended("b:0") and svc.runner.stats["duplicates"] == 1)
    assert handler.calls == Counter({"a:0": 1, "b:0": 2, "c:0": 1, "d:0": 1, "e:0": 1})
    assert kafka.committed == {TP0: 3, TP1: 2}
    assert svc.runner.stats["dead_lettered"] == 0
