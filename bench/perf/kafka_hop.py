"""The floor under every hop: one aiokafka producer and one consumer, nothing else, on the stack's broker.

A record is produced (``acks=all``, idempotent, ``linger_ms=0``, as the services do) and the same
process waits until its consumer (``read_committed``, as the services) has it; one at a time, with a
pause between, like a run at concurrency 1. What a pipeline hop costs above this is agentstream's;
this much is the client library's and the broker's on this machine. ``--topics 5 --partitions 8``
subscribes the consumer to as many partitions as the planner reads (aiokafka has no incremental fetch
sessions, KIP-227: every fetch names every partition, and every response lists them all).

    .venv/bin/python -m bench.perf.kafka_hop [--topics 1] [--partitions 1] [--records 300] [--rounds 3] [--json]

``--secure`` measures what authentication and authorization cost a hop: two private brokers of the same
build, one PLAINTEXT and one as ``agentstream dev up --secure`` runs it (SASL/SCRAM-SHA-512, the
StandardAuthorizer), the second used by an ordinary principal whose ACLs allow the benchmark's topics and
group (so every request is authorized, not waved through as the super user's), rounds alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agentstream.devstack.stack import DevStack
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options


async def one_round(bootstrap: str, records: int, topics: int, partitions: int,
                    auth: KafkaAuth | None = None) -> tuple[float, float]:
    """Median (hop, produce acknowledgement) in ms over ``records`` records on new topics, sent round the
    topics and partitions in turn."""
    names = [f"hop-{uuid.uuid4().hex[:8]}" for _ in range(topics)]
    auth = auth or KafkaAuth()
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth))
    await admin.start()
    await admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    producer = AIOKafkaProducer(**kafka_options(bootstrap, auth), acks="all", enable_idempotence=True, linger_ms=0)
    consumer = AIOKafkaConsumer(*names, **kafka_options(bootstrap, auth), group_id=names[0],
                                auto_offset_reset="earliest", isolation_level="read_committed",
                                enable_auto_commit=False, fetch_max_wait_ms=100)
    await producer.start()
    await consumer.start()
    try:
        while not consumer.assignment():  # joined: the first fetch goes out
            await consumer.getmany(timeout_ms=100)
        hops, acks = [], []
        for i in range(records + 20):
            t0 = time.perf_counter()
            acked = await producer.send(names[i % topics], b"x" * 300, partition=i % partitions)
            while not await consumer.getmany(timeout_ms=1000):
                pass
            t1 = time.perf_counter()
            await acked
            if i >= 20:  # the first ones warm the connections up
                hops.append((t1 - t0) * 1000)
                acks.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.005)
    finally:
        await producer.stop()
        await consumer.stop()
        await admin.delete_topics(names)
        await admin.close()
    return statistics.median(hops), statistics.median(acks)


async def main(bootstrap: str, records: int, rounds: int, topics: int, partitions: int) -> dict:
    results = [await one_round(bootstrap, records, topics, partitions) for _ in range(rounds)]
    return {"hop_p50_ms": [round(h, 3) for h, _ in results], "ack_p50_ms": [round(a, 3) for _, a in results],
            "records": records, "topics": topics, "partitions": partitions}


async def compare_secure(records: int, rounds: int, topics: int, partitions: int) -> dict:
    """Alternating rounds on a plain and a secure private broker (see the module docstring)."""
    import tempfile
    from pathlib import Path

    from agentstream.devstack.private import PrivateStack
    from agentstream.ops.acls import AclBinding, Operation, Pattern, Resource, apply_acls

    with tempfile.TemporaryDirectory(prefix="kafka-hop.") as tmp:
        plain, secure = PrivateStack(Path(tmp) / "plain"), PrivateStack(Path(tmp) / "secure", secure=True)
        await asyncio.gather(plain.start(), secure.start())
        try:
            await apply_acls(secure.bootstrap, secure.auth("admin"), [
                AclBinding("client", resource, "hop-", Operation.ALL, Pattern.PREFIXED)
                for resource in (Resource.TOPIC, Resource.GROUP)])
            out: dict[str, list] = {"plain": [], "secure": []}
            for _ in range(rounds):
                out["plain"].append(await one_round(plain.bootstrap, records, topics, partitions))
                out["secure"].append(await one_round(secure.bootstrap, records, topics, partitions,
                                                     secure.auth("client")))
        finally:
            await asyncio.gather(plain.close(), secure.close())
    return {f"{kind}_{key}": [round(r[i], 3) for r in results] for kind, results in out.items()
            for i, key in enumerate(("hop_p50_ms", "ack_p50_ms"))} | {"records": records, "topics": topics,
                                                                        "partitions": partitions}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=1, help="topics the consumer reads")
    parser.add_argument("--partitions", type=int, default=1, help="partitions per topic")
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--secure", action="store_true", help="plain against SASL/SCRAM + ACLs, alternating rounds")
    args = parser.parse_args()
    try:
        import uvloop  # as the workers run
        uvloop.install()
    except ImportError:
        pass
    if args.secure:
        out = asyncio.run(compare_secure(args.records, args.rounds, args.topics, args.partitions))
        print(f"bare aiokafka hop, median per round — plain: {out['plain_hop_p50_ms']} ms, SASL/SCRAM + ACLs: "
              f"{out['secure_hop_p50_ms']} ms; produce acknowledged — plain: {out['plain_ack_p50_ms']} ms, secure: "
              f"{out['secure_ack_p50_ms']} ms")
        if args.json:
            print(json.dumps(out))
        raise SystemExit(0)
    bootstrap = DevStack().up().kafka
    out = asyncio.run(main(bootstrap, args.records, args.rounds, args.topics, args.partitions))
    print(f"bare aiokafka hop, consumer on {args.topics} x {args.partitions} partitions (produce → consumer has "
          f"it), median per round: {out['hop_p50_ms']} ms; "
          f"produce acknowledged: {out['ack_p50_ms']} ms")
    if args.json:
        print(json.dumps(out))
