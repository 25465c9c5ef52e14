"""Why the planner is not a faust app: the same stateful loop on faust-streaming and on our runtime.

Both consume keyed events, keep a per-key counter (faust: a Table with its changelog; ours: a dict,
the planner keeps its state in PostgreSQL), and publish one output per event with acks=all, committing
offsets after the outputs are acknowledged. Measured: events/s through the loop (producer → loop →
consumer of the outputs), and how long a replacement worker takes to resume after the first one is
killed with SIGKILL (faust with broker_session_timeout=10 s, ours with session_timeout_ms=10 s).

    .venv/bin/python -m bench.experiments.faust_vs_runtime [--events 5000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from agentstream.devstack.stack import DevStack
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import TopicSpec

#: The repository root: both workers run there (the faust app as ``python -m bench.experiments.faust_planner.app``).
ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4

RUNTIME_WORKER = """
import asyncio, os, signal
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.config.settings import Settings
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner
from agentstream.streams.core.events import TokenChunk

async def main():
    settings = Settings.load()
    runtime = Runtime(settings, codec_for(settings))
    await runtime.start()
    counts = {}
    async def handle(event, ctx):
        counts[event.run_id] = counts.get(event.run_id, 0) + 1
        await ctx.emit(os.environ["OUT"], event)
    config = ServiceConfig(name="bench", topics=[os.environ["IN"]], group_id=os.environ["APP_ID"],
                           concurrency=64, session_timeout_ms=10000)
    runner = ServiceRunner(runtime, config, handle)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, runner.stop)
    await runner.run()
    await runtime.stop()

asyncio.run(main())
"""


def start(kind: str, env: dict[str, str]) -> subprocess.Popen:
    if kind == "faust":
        argv = [sys.executable, "-m", "bench.experiments.faust_planner.app", "worker", "-l", "error"]
    else:
        argv = [sys.executable, "-c", RUNTIME_WORKER]
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run(kind: str, bootstrap: str, events: int) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    topics = {"IN": f"bench.{kind}.{tag}.in", "OUT": f"bench.{kind}.{tag}.out"}
    await ensure_topics(bootstrap, [TopicSpec(t, PARTITIONS) for t in topics.values()], auth=Settings.load().kafka_auth)
    env = {**os.environ, **topics, "APP_ID": f"bench-{kind}-{tag}", "BOOTSTRAP": bootstrap,
           "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PARTITIONS": str(PARTITIONS)}
    from agentstream.streams.core.events import TokenChunk
    from agentstream.streams.kafka.codec import codec_for

    codec = codec_for(Settings.load())

    def value(i: int) -> bytes:
        return codec.encode(TokenChunk.build(run_id=f"run{i % 500}", step=f"s{i}", service="bench", seq=i, text="x"))

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    consumer = AIOKafkaConsumer(topics["OUT"], bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await producer.start()
    await consumer.start()
    worker = start(kind, env)
    try:
        await producer.send_and_wait(topics["IN"], value(0), key=b"run0")  # ready when it answers
        await consumer.getone()
        t0 = time.perf_counter()
        sent = [await producer.send(topics["IN"], value(i), key=f"run{i % 500}".encode()) for i in range(1, events + 1)]
        await asyncio.gather(*sent)
        got = 0
        while got < events:
            batch = await consumer.getmany(timeout_ms=5000)
            if not batch:
                break
            got += sum(len(v) for v in batch.values())
        rate = got / (time.perf_counter() - t0)

        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = start(kind, env)
        t0 = time.perf_counter()
        await producer.send_and_wait(topics["IN"], value(events + 1), key=b"run1")
        await consumer.getone()
        resume = time.perf_counter() - t0
    finally:
        worker.kill()
        worker.wait()
        await producer.stop()
        await consumer.stop()
    return {"events_per_s": round(rate, 1), "resume_after_kill_s": round(resume, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bootstrap = DevStack().up().kafka
    result = {kind: asyncio.run(run(kind, bootstrap, args.events)) for kind in ("faust", "runtime")}
    for kind, r in result.items():
        print(f"{kind:>8}: {r['events_per_s']:>8} events/s   resumes {r['resume_after_kill_s']} s after kill -9")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
