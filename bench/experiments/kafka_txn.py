"""What a Kafka transaction would cost the planner, against what it does now — before building it.

Issue 15 names Kafka transactions as a way to take the PostgreSQL history write off the planner's path:
each transition's outputs, its state (on a compacted topic) and its input offsets committed at once,
PostgreSQL written afterwards as a projection. This measures the Kafka half of that on the stack's broker,
with a bare aiokafka producer, per batch of ``k`` transitions (a transition = its output event and its
state record, 2 records of ~1 KB):

- ``acks``: what the planner's Kafka side does today — the records sent by an idempotent producer
  (``acks=all``, ``linger_ms=0``) and every acknowledgement awaited (offsets are committed every 50 ms off
  the path, so not here);
- ``txn``: a transactional producer — begin, the same records, ``send_offsets_to_transaction`` for the
  input partitions, commit (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn and the
  coordinator's markers on every partition written).

Reported per mode and ``k``: the wall time per batch (median; a batch waits for all of it, as a
transition would) and CPU per transition of this process plus the broker (``/proc``; the broker's idle
CPU, measured for 3 s before the rounds, is subtracted over each round's window), rounds alternating.
Compare with ``bench/perf/history_write.py``: the PostgreSQL commit the transaction would take off the path.

    .venv/bin/python -m bench.experiments.kafka_txn [--sizes 1,13,50] [--transitions 300] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
import uuid

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agentstream.devstack.stack import DevStack
from bench.perf.proc_cpu import cpu_seconds

PARTITIONS = 8
RECORD = b"x" * 1000


def broker_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "kafka.Kafka"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


async def idle_rate() -> float:
    """The broker's CPU seconds per second with nothing sent to it (its controller, timers)."""
    pids = broker_pids()
    c0, t0 = cpu_seconds(pids), time.perf_counter()
    await asyncio.sleep(3)
    return (cpu_seconds(pids) - c0) / (time.perf_counter() - t0)


async def one_round(bootstrap: str, mode: str, size: int, batches: int, idle: float) -> tuple[float, float]:
    """(median wall ms per batch, CPU ms per transition: this process + the broker) over ``batches``
    batches of ``size`` transitions, on new topics."""
    out, state = f"txn-out-{uuid.uuid4().hex[:8]}", f"txn-state-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(out, PARTITIONS, 1),
                               NewTopic(state, PARTITIONS, 1, topic_configs={"cleanup.policy": "compact"})])
    options: dict = {"bootstrap_servers": bootstrap, "acks": "all", "enable_idempotence": True, "linger_ms": 0}
    if mode == "txn":
        options["transactional_id"] = f"txn-bench-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(**options)
    await producer.start()
    group = f"txn-bench-{uuid.uuid4().hex[:8]}"
    pids = broker_pids()
    walls: list[float] = []
    try:
        cpu0 = started = 0.0
        for b in range(batches + 10):
            if b == 10:  # the first batches warm the connections and the coordinator up
                cpu0, started = cpu_seconds(pids) + time.process_time(), time.perf_counter()
            t0 = time.perf_counter()
            keys = [f"run-{b}-{i}".encode() for i in range(size)]
            if mode == "txn":
                await producer.begin_transaction()
            sent = []
            for key in keys:
                sent.append(await producer.send(out, RECORD, key=key))
                sent.append(await producer.send(state, RECORD, key=key))
            if mode == "txn":
                offsets = {TopicPartition(out, i % PARTITIONS): b * size + i + 1 for i in range(size)}
                await producer.send_offsets_to_transaction(offsets, group)
                await producer.commit_transaction()
            else:
                await asyncio.gather(*sent)
            if b >= 10:
                walls.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.002)  # idle between batches, as between a run's transitions
        cpu = cpu_seconds(pids) + time.process_time() - cpu0 - idle * (time.perf_counter() - started)
    finally:
        await producer.stop()
        await admin.delete_topics([out, state])
        await admin.close()
    return statistics.median(walls), 1000 * cpu / (batches * size)


async def main(bootstrap: str, sizes: list[int], transitions: int, rounds: int) -> dict[str, object]:
    """Rounds of every size, acknowledged and transactional in turn; medians per mode and size."""
    results: dict[str, list[tuple[float, float]]] = {}
    idle = await idle_rate()
    for _ in range(rounds):
        for size in sizes:
            for mode in ("acks", "txn"):
                batches = max(20, transitions // size)
                results.setdefault(f"{mode}/{size}", []).append(await one_round(bootstrap, mode, size, batches, idle))
    report: dict[str, object] = {"broker_idle_cpu_per_s": round(idle, 4)}
    for key, values in results.items():
        report[key] = {"wall_ms_per_batch": round(statistics.median(w for w, _ in values), 3),
                       "cpu_ms_per_transition": round(statistics.median(c for _, c in values), 3),
                       "rounds": [[round(w, 3), round(c, 3)] for w, c in values]}
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,13,50", help="transitions per batch")
    parser.add_argument("--transitions", type=int, default=300, help="per round and size (at least 20 batches)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        import uvloop  # as the workers run
        uvloop.install()
    except ImportError:
        pass
    kafka = DevStack().up().kafka
    report = asyncio.run(main(kafka, [int(s) for s in args.sizes.split(",")], args.transitions, args.rounds))
    print(f"{'mode/transitions per batch':>28}  {'wall ms/batch':>14}  {'CPU ms/transition (client + broker)':>36}")
    for key, row in report.items():
        if not isinstance(row, dict):
            continue
        print(f"{key:>28}  {row['wall_ms_per_batch']:>14}  {row['cpu_ms_per_transition']:>36}")
    if args.json:
        print(json.dumps(report))
