"""The schemas topic: how processes with different versions of a schema read each other's events.

Without a registry server a schema's id is a hash of the schema (``streams/kafka/registry.py``), so a process
knows the ids of the schema files it has, and no others. During a rolling upgrade a newer worker writes
an event with a newer version of its schema (a field added, with a default): an id the older workers have
never seen, which they would dead-letter as ``unknown_schema``, stranding the run. So:

- every process publishes the schemas it writes with to ``{prefix}agent.schemas`` (compacted, one
  partition; key: the schema id in ASCII decimal, value: the schema's JSON) before it writes with them
  (``Runtime.publish_schemas``: a worker at start, a client when it connects);
- a codec that meets an id it does not know reads that topic from where it last stopped up to its end,
  learns what is new, and decodes again (``Codec.decode_async``). Publishing comes before writing, so
  the topic's end, read after the record was, covers the record's schema: an id still unknown then is no
  agentstream process's, and is ``unknown_schema`` as before.

Avro resolution does the rest: an older reader skips a field it does not have, a newer reader fills
in the default of a field the writer did not have. A published schema is checked against its key (the
id is the hash of its canonical form), so the topic cannot make a reader decode an id with another
schema. With a Confluent-compatible registry (``HttpRegistry``) none of this runs: the server gives out
and serves the ids. docs/upgrades.md has the procedure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaTimeoutError

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.errors import UnknownSchema
from agentstream.streams.kafka.registry import MAX_LEARNT, LocalRegistry, RawSchema, full_name, schema_id
from agentstream.streams.kafka.schema_guard import MAX_SCHEMA_BYTES

log = logging.getLogger(__name__)
#: Records learnt between two yields to the event loop during a read.
READ_BATCH = 2000


def encode_schema(raw: RawSchema) -> tuple[bytes, bytes]:
    """(key, value) of the record that publishes ``raw``."""
    return str(schema_id(raw)).encode(), json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()


class SchemaLog:
    """Publish this process's schemas to the schemas topic; learn other processes' schemas from it.

    The consumer that reads the topic is started on the first lookup and kept (a later lookup reads
    only what was added since); ``close()`` stops it."""

    def __init__(self, bootstrap: str, topic: str, registry: LocalRegistry, *, timeout_s: float = 15.0,
                 auth: KafkaAuth) -> None:
        self.bootstrap = bootstrap
        self.auth = auth
        self.topic = topic
        self.registry = registry
        self.timeout_s = timeout_s
        self._tp = TopicPartition(topic, 0)
        self._consumer: AIOKafkaConsumer | None = None
        self._lock: asyncio.Lock | None = None
        self._position = 0
        #: When the last completed read of the topic started (``time.monotonic``).
        self._read_at = float("-inf")
        #: Reads of the topic, and schemas learnt from it (for logs and tests).
        self.reads = 0
        self.learnt = 0

    async def publish(self, producer: AIOKafkaProducer) -> int:
        """Publish every current schema (the ones this process writes with); return how many. Idempotent:
        the topic is compacted by id, and a schema's id never changes."""
        futures = []
        for raw in self.registry.raw_current().values():
            key, value = encode_schema(raw)
            futures.append(await producer.send(self.topic, value, key=key))
        await asyncio.gather(*futures)
        return len(futures)

    async def lookup(self, sid: int) -> bool:
        """Whether ``sid`` is known, after reading the topic up to its end if it was not. Concurrent
        lookups share one read, provided it started after they were asked. Raises the broker's error
        when the topic cannot be read (an outage: the runtime waits it out)."""
        if self.registry.knows(sid):
            return True
        asked = time.monotonic()
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self.registry.knows(sid) and self._read_at < asked:
                started = time.monotonic()
                await self._read()
                self._read_at = started
        return self.registry.knows(sid)

    async def _read(self) -> None:
        """Read the topic from where the last read stopped up to its end as it is now, learning schemas.

        The position moves with every record (a read cut short resumes where it stopped), and the
        timeout is on silence, not on the whole read: a broker that sends nothing for ``timeout_s`` is
        an outage (the runtime waits it out), while a topic flooded with millions of junk records is
        read through at the pace of the fetches, once per process (issue 37, finding 3: a timeout on
        the whole read, with the position kept only on success, made a flood an endless outage)."""
        consumer = await self._started_consumer()
        if consumer is None:
            return
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        if end <= self._position:
            return
        self.reads += 1
        consumer.seek(self._tp, self._position)
        skipped = _Skipped(self.topic)
        try:
            quiet_since = time.monotonic()
            while self._position < end:
                batch = (await consumer.getmany(self._tp, timeout_ms=200, max_records=READ_BATCH)).get(self._tp, [])
                if not batch:
                    if time.monotonic() - quiet_since > self.timeout_s:
                        raise KafkaTimeoutError(f"{self.topic} sent nothing for {self.timeout_s:g} s while read up to "
                                                f"offset {end} (at {self._position})")
                    continue
                quiet_since = time.monotonic()
                for msg in batch:
                    problem = self._learn(msg.key, msg.value)
                    if problem is not None:
                        skipped.add(msg.offset, problem)
                    self._position = msg.offset + 1
                await asyncio.sleep(0)  # a long read shares the event loop with the records being handled
        finally:
            skipped.report()

    async def _started_consumer(self) -> AIOKafkaConsumer | None:
        """The topic's consumer, or None when the topic does not exist (no process that publishes
        schemas has started on this cluster yet)."""
        if self._consumer is not None:
            return self._consumer
        consumer = AIOKafkaConsumer(**kafka_options(self.bootstrap, self.auth), enable_auto_commit=False,
                                    auto_offset_reset="earliest", client_id="agentstream-schemas")
        await consumer.start()
        try:
            if self.topic not in await consumer.topics():
                await consumer.stop()
                return None
            consumer.assign([self._tp])
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        return consumer

    def _learn(self, key: bytes | None, value: bytes | None) -> str | None:
        """Learn the schema a record publishes; None when it was one (or a tombstone), else why it was
        skipped. The cheap checks come first, so junk costs little: only a value that names one of this
        process's events is parsed as a schema."""
        if value is None:
            return None  # a tombstone: nothing to learn (a schema once published stays decodable here)
        if key is None or not (0 < len(key) <= 10 and key.isdigit()):
            return "the key is not a schema id"
        if len(value) > MAX_SCHEMA_BYTES:
            return f"{len(value)} bytes, over the {MAX_SCHEMA_BYTES}-byte limit of a schema"
        if self.registry.knows(int(key)):
            return None  # known: its key is its id (checked when it was learnt)
        if self.registry.full:  # a flood of distinct versions: the rest is not even parsed
            return f"schema {key.decode()}: not learnt, {MAX_LEARNT} schemas were learnt already"
        try:
            raw = json.loads(value)
        except ValueError:
            return "not JSON"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            return "not a named schema"
        try:
            if self.registry.reader_name(raw) is None:
                return f"{raw['name'][:80]!r} is not an agentstream event"
            sid = schema_id(raw)
        except Exception as exc:  # a schema fastavro cannot parse (it raises many types)
            return f"not a schema ({type(exc).__name__}: {str(exc)[:200]})"
        if key != str(sid).encode():
            return f"key {key.decode()} is not the id of its schema ({sid})"
        try:
            self.registry.learn(raw)
        except UnknownSchema as exc:
            return f"schema {sid}: {exc}"
        self.learnt += 1
        log.info("learnt schema %d (%s) from %s", sid, full_name(raw), self.topic)
        return None

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


class _Skipped:
    """The records a read skipped: the first few logged with their reason, the rest counted and summed up
    once at the end of the read, so a flood of junk costs one line per read, not one per record."""

    LOGGED = 5

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.count = 0

    def add(self, offset: int, problem: str) -> None:
        self.count += 1
        if self.count <= self.LOGGED:
            log.warning("%s@%d: skipped, %s", self.topic, offset, problem)

    def report(self) -> None:
        if self.count > self.LOGGED:
            log.warning("%s: %d more records skipped in this read (not schemas agentstream learns)", self.topic,
                        self.count - self.LOGGED)


__all__ = ["READ_BATCH", "SchemaLog", "encode_schema"]
