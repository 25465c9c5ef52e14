"""Issue 37, finding 3, at full size: flood the schemas topic, then send a record with an unknown schema id.

The attack: 2.5 M junk records with distinct keys on ``agent.schemas`` (compaction never removes them),
then one record with a schema id nobody published. Before the fix the planner's read of the topic
exceeded its 15 s timeout, the timeout counted as a broker outage and the position advanced only on
success, so the record waited forever and the log grew by one warning per junk record (810 MB in 100 s).

This starts a private stack and one planner process (the only service that reads the intake), floods the
topic, sends the record and reports how long until it is dead-lettered, the planner's CPU meanwhile, how
many lines its log gained, and that a task submitted right after still completes (an inference worker
with the scripted model answers it).

    .venv/bin/python -m bench.chaos.schema_flood [--records 2500000] [--kind junk|schemas] [--json]

``--kind schemas`` floods with compatible versions of ``TaskSubmitted``, each with an optional field of its
own (so an id of its own) under its correct id: the dearest records to read (every one is parsed, hashed
and checked), and ones a reader would learn, up to ``MAX_LEARNT`` — what a holder of a service's
credential could send.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer, TopicPartition

from agentstream.devstack.private import PrivateStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.kafka_auth import kafka_options
from agentstream.streams.core.errors import TaskRejected
from agentstream.streams.core.events import DeadLetter, TaskSubmitted
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.kafka.schema_log import encode_schema
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import end_offsets, read_events
from bench.perf.proc_cpu import cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "flood."


def flood_record(kind: str, i: int, base: dict) -> tuple[bytes, bytes]:
    """The i-th flood record (key, value): about 300 bytes of junk under a decimal key, or a compatible
    version of ``base`` under its own id."""
    if kind == "junk":
        return b"%d" % (10_000_000 + i), b'{"junk": %d, "pad": "%s"}' % (i, b"x" * 270)
    return encode_schema({**base, "fields": [*base["fields"], {"name": f"flood_{i}", "type": ["null", "string"],
                                                                "default": None}]})


async def flood(stack: PrivateStack, topic: str, records: int, kind: str) -> float:
    """Produce the flood as fast as the client goes; return the seconds it took."""
    producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth()), acks=1, linger_ms=20,
                                max_batch_size=1 << 16)
    await producer.start()
    started = time.monotonic()
    try:
        pending = []
        base = LocalRegistry().raw_current()[TaskSubmitted.schema_name]
        for i in range(records):
            key, value = flood_record(kind, i, base)
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.monotonic() - started


async def dead_lettered(stack: PrivateStack, topics: Topics, where: tuple[int, int], timeout: float) -> DeadLetter | None:
    settings = stack.settings(topic_prefix=PREFIX)
    dlq = TopicPartition(topics.dlq, 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        end = (await end_offsets(settings, [dlq]))[dlq]
        for letter in await read_events(settings, dlq, 0, expect=end, timeout=5) if end else []:
            if (isinstance(letter, DeadLetter) and letter.source_topic == topics.tasks
                    and (letter.source_partition, letter.source_offset) == where):
                return letter
        await asyncio.sleep(0.5)
    return None


async def measure(stack: PrivateStack, args: argparse.Namespace, planner: subprocess.Popen, log: Path) -> dict:
    settings = stack.settings(topic_prefix=PREFIX)
    topics = Topics.of(settings)
    async with AgentClient(settings) as client:  # warm: a run end to end, so the planner has joined
        deadline = time.monotonic() + 120
        while True:
            try:
                warm = await client.submit("What is 1 + 1?", tools=["calculator"], prefetch=False)
                break
            except TaskRejected:  # the tool worker has not registered its tools yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert (await client.wait(warm, timeout=120)).ok
        flood_s = await flood(stack, topics.schemas, args.records, args.kind)
        lines_before = _lines(log)
        cpu_before = cpu_seconds([planner.pid])
        producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth()), acks="all")
        await producer.start()
        run_id = new_run_id()
        try:
            meta = await producer.send_and_wait(topics.tasks, struct.pack(">bI", 0, 123_456_789) + b"\x02hi",
                                                key=run_id.encode(), partition=topics.partition_for(run_id))
        finally:
            await producer.stop()
        sent = time.monotonic()
        letter = await dead_lettered(stack, topics, (meta.partition, meta.offset), args.timeout)
        to_letter = time.monotonic() - sent
        cpu = cpu_seconds([planner.pid]) - cpu_before
        after = await client.wait(await client.submit("What is 2 + 2?", tools=["calculator"], prefetch=False),
                                  timeout=120)
    return {"records": args.records, "kind": args.kind, "flood_s": round(flood_s, 1),
            "dead_lettered": letter is not None and letter.error_kind == "unknown_schema",
            "to_dead_letter_s": round(to_letter, 1), "planner_cpu_s": round(cpu, 1),
            "log_lines_added": _lines(log) - lines_before, "log_bytes": _size(log), "next_run_ok": after.ok}


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def _size(path: Path) -> int:
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_500_000)
    parser.add_argument("--kind", choices=("junk", "schemas"), default="junk")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the dead letter")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agentstream-schema-flood-"))
    stack = PrivateStack(work / "state")
    asyncio.run(stack.start())
    settings = stack.settings(topic_prefix=PREFIX)
    asyncio.run(stack.grant(Topics.of(settings)))
    env = {**os.environ, **stack.env(), "AGENTSTREAM_TOPIC_PREFIX": PREFIX,
           "AGENTSTREAM_PARTITIONS": str(settings.partitions), "AGENTSTREAM_TRACING": "off",
           "AGENTSTREAM_METRICS_PORT": "off"}
    procs = []
    log = work / "planner.log"
    try:
        for service, argv in (("planner", []), ("inference", []), ("tools", ["--tools", "agentstream.services.tools.builtin"])):
            with open(work / f"{service}.log", "ab") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", service, *argv],
                                              env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
        report = asyncio.run(measure(stack, args, procs[0], log))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        asyncio.run(stack.close())
        shutil.rmtree(work, ignore_errors=True)
    print(f"{report['records']:,} {report['kind']} records flooded in {report['flood_s']} s; the unknown-schema record "
          f"{'was dead-lettered' if report['dead_lettered'] else 'was NOT dead-lettered'} after "
          f"{report['to_dead_letter_s']} s, planner CPU {report['planner_cpu_s']} s, its log +{report['log_lines_added']} "
          f"lines ({report['log_bytes']:,} bytes in all); a run right after: {'ok' if report['next_run_ok'] else 'FAILED'}")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
