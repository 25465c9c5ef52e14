"""A client of agentstream's topics written as a team without agentstream's Python package would write one,
from docs/contract.md alone: it imports nothing from agentstream (tests/unit/test_contract.py checks).

- values: the Avro schemas read from ``schemas/*.avsc``, written with fastavro, in the Confluent wire
  format (0x00, the schema id as 4 bytes big-endian, Avro binary);
- schema ids without a registry: the first 4 bytes of the SHA-256 of the schema's Parsing Canonical Form
  (computed here from the Avro specification, not with fastavro's helper), top bit cleared;
- key: the run id as raw UTF-8; partitioner: librdkafka's default (``consistent_random``: CRC32 of the
  key), not Kafka's murmur2; batches compressed with snappy (franz-go's default); no headers at all;
- an event id that is not a UUID.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import time
import uuid
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import RecordMetadata

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
NAMESPACE = "io.agentstream.events"
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def canonical_form(schema: Any, namespace: str = "", seen: set[str] | None = None) -> str:
    """The Parsing Canonical Form of the Avro specification: full names, only the attributes that matter
    for parsing (name, type, fields, symbols, items, values, size) in that order, no whitespace, a named
    type written out at its first use and by name after."""
    seen = set() if seen is None else seen
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return json.dumps(schema)
        return json.dumps(schema if "." in schema or not namespace else f"{namespace}.{schema}")
    if isinstance(schema, list):
        return "[" + ",".join(canonical_form(s, namespace, seen) for s in schema) + "]"
    kind = schema["type"]
    if isinstance(kind, (dict, list)) or kind in _PRIMITIVES:  # {"type": "long", "logicalType": …} is "long"
        return canonical_form(kind, namespace, seen)
    if kind == "array":
        return '{"type":"array","items":' + canonical_form(schema["items"], namespace, seen) + "}"
    if kind == "map":
        return '{"type":"map","values":' + canonical_form(schema["values"], namespace, seen) + "}"
    name = schema["name"]
    if "." in name:
        full, namespace = name, name.rsplit(".", 1)[0]
    else:
        namespace = schema.get("namespace", namespace) or ""
        full = f"{namespace}.{name}" if namespace else name
    if full in seen:
        return json.dumps(full)
    seen.add(full)
    out = '{"name":' + json.dumps(full) + ',"type":' + json.dumps(kind)
    if kind == "record":
        out += ',"fields":[' + ",".join(
            '{"name":' + json.dumps(f["name"]) + ',"type":' + canonical_form(f["type"], namespace, seen) + "}"
            for f in schema["fields"]) + "]"
    elif kind == "enum":
        out += ',"symbols":' + json.dumps(schema["symbols"], separators=(",", ":"))
    elif kind == "fixed":
        out += ',"size":' + json.dumps(schema["size"])
    return out + "}"


def schema_id(schema: dict[str, Any]) -> int:
    """The id a schema has without a registry (docs/contract.md, "Schema ids")."""
    digest = hashlib.sha256(canonical_form(schema).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def load_schema(record: str, directory: Path = SCHEMAS) -> tuple[int, Any]:
    """(schema id, fastavro's parsed schema) of ``schemas/{record}.avsc``."""
    raw = json.loads((directory / f"{record}.avsc").read_text())
    return schema_id(raw), fastavro.parse_schema(raw)


def encode(record: str, datum: dict[str, Any]) -> bytes:
    """Confluent wire format: magic byte 0, the schema id (4 bytes, big-endian), the Avro body."""
    sid, schema = load_schema(record)
    out = io.BytesIO()
    out.write(b"\x00" + sid.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, schema, datum)
    return out.getvalue()


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's default partitioner (``consistent_random``) for a keyed record."""
    return zlib.crc32(key) % partitions


def librdkafka_default_partitioner(key: bytes | None, all_partitions: Sequence[int],
                                   available: Sequence[int]) -> int:
    """The same, in the form aiokafka's producer takes."""
    if key is None:
        return (available or all_partitions)[0]
    return all_partitions[crc32_partition(key, len(all_partitions))]


def task_submitted(run_id: str, task: str, tools: Iterable[str], max_steps: int = 5) -> dict[str, Any]:
    return {
        "event_id": f"ext-{uuid.uuid4().hex}",  # not a UUID: any non-empty string will do
        "run_id": run_id,
        "step_id": f"{run_id}:task",
        "parent_step_id": None,
        "attempt": 0,
        "created_at": datetime.now(UTC),
        "producer": {"service": "foreign-client", "instance": f"test:{os.getpid()}"},
        "task": task,
        "tools": list(tools),
        "max_steps": max_steps,
        "deadline": None,
        "model": None,
        "system_prompt": None,
        "metadata": {"origin": "foreign"},
        "prefetch": True,
        "on_tool_error": "tell_model",
        "replay_of": None,
    }


async def publish_tasks(bootstrap: str, topic: str, tasks: Sequence[dict[str, Any]]) -> list[RecordMetadata]:
    """Publish TaskSubmitted events keyed by run id, CRC32-partitioned, snappy-compressed, without headers."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", partitioner=librdkafka_default_partitioner,
                                compression_type="snappy")
    await producer.start()
    try:
        return [await producer.send_and_wait(topic, encode("TaskSubmitted", t), key=t["run_id"].encode())
                for t in tasks]
    finally:
        await producer.stop()


async def read_outcomes(bootstrap: str, topic: str, run_ids: Iterable[str], *,
                        timeout: float = 60.0) -> dict[str, tuple[str, dict[str, Any]]]:
    """RunCompleted / RunFailed of each run, read from every partition of ``topic`` from the start:
    run id -> (record name, datum). Other events, and other runs, are skipped."""
    wanted = set(run_ids)
    readers = {}
    for record in ("RunCompleted", "RunFailed"):
        sid, schema = load_schema(record)
        readers[sid] = (record, schema)
    # No consumer group: every partition, from the start (the run's own is murmur2(run id) % partitions).
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    try:
        deadline = time.monotonic() + timeout
        while wanted - found.keys() and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for messages in batch.values():
                for msg in messages:
                    value = msg.value or b""
                    if len(value) < 5 or value[0] != 0:
                        continue
                    reader = readers.get(int.from_bytes(value[1:5], "big"))
                    if reader is None:
                        continue
                    record, schema = reader
                    datum = fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)
                    assert isinstance(datum, dict)
                    if datum["run_id"] in wanted and msg.key == datum["run_id"].encode():
                        found[datum["run_id"]] = (record, datum)
            await asyncio.sleep(0)
    finally:
        await consumer.stop()
    return found
