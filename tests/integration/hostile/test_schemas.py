"""Issue 37, findings 2 and 3: the schemas topic, which decides how every other record is read.

2. One 146-byte record wedged a planner for good: a ``TaskSubmitted`` writer schema with an extra
   ``array<null>`` field, then a record claiming 2^62 items, which fastavro skipped one at a time on the
   event loop. Now a reader learns only compatible versions of its own events with no zero-byte array
   items (``streams/kafka/schema_guard.py``), and only the services may publish schemas: the record is
   dead-lettered as ``unknown_schema`` and the planner goes on.
3. A flood of junk records with distinct keys, then a record with an unknown schema id, made an endless
   "outage" and one warning per junk record. Now the read resumes where it stopped and times out only on
   silence, and a read logs a few skipped records and one summary (the full-size flood, 2.5 M records,
   is ``bench/chaos/schema_flood.py``).
"""

from __future__ import annotations

import io
import json
import struct

import fastavro
import pytest

from agentstream.ops.acls import tenant_principal
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.registry import LocalRegistry, schema_id
from tests.integration.acl_probes import can_write, producer, send
from tests.integration.hostile.conftest import ACME, PLANNERS, Cells

pytestmark = pytest.mark.asyncio(loop_scope="package")

FLOOD = 30_000


def _wedging_schema() -> dict:
    raw = LocalRegistry().raw_current()[TaskSubmitted.schema_name]
    return {**raw, "fields": [*raw["fields"], {"name": "pad", "type": {"type": "array", "items": "null"},
                                                 "default": []}]}


def _wedging_record(raw: dict, run_id: str) -> bytes:
    """A valid TaskSubmitted written with ``raw``, whose last field claims 2^62 null items (no bytes each)."""
    task = TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="mallory", task="hi", max_steps=2)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(raw), {**task.to_dict(), "pad": []})
    body = out.getvalue()
    assert body.endswith(b"\x00")  # the empty array: a block count of 0
    count = (2 ** 62) << 1  # zig-zag
    varint = bytearray()
    while count > 0x7F:
        varint.append((count & 0x7F) | 0x80)
        count >>= 7
    varint.append(count)
    return struct.pack(">bI", 0, schema_id(raw)) + body[:-1] + bytes(varint) + b"\x00"


async def test_clients_and_tenants_may_not_publish_schemas(cells: Cells):
    topics = cells.topics(ACME)
    assert not await can_write(cells.stack, tenant_principal(ACME), topics.schemas)
    assert not await can_write(cells.stack, "client", topics.schemas)
    assert await can_write(cells.stack, "planner", topics.schemas)


async def test_a_schema_that_would_wedge_the_planner_is_not_learnt(cells: Cells):
    topics = cells.topics(ACME)
    raw = _wedging_schema()
    # The shared `tools` principal may still publish schemas: the readers judge what they learn.
    await send(cells.stack, "tools", topics.schemas, json.dumps(raw).encode(), str(schema_id(raw)), 0)
    run_id = new_run_id()
    record = _wedging_record(raw, run_id)
    assert len(record) < 200
    where = await send(cells.stack, tenant_principal(ACME), topics.tasks, record, run_id, topics.partition_for(run_id))
    letter = await cells.dead_letter(ACME, topics.tasks, where)
    assert letter.error_kind == "unknown_schema", letter
    assert "can encode in zero bytes" in cells.log_text(*PLANNERS)
    async with cells.client(ACME) as client:
        assert (await client.wait(await client.submit("What is 4 * 4?", tools=["calculator"], prefetch=False),
                                  timeout=60)).ok


async def test_a_flood_of_junk_schemas_is_read_through_and_logged_in_a_few_lines(cells: Cells):
    topics = cells.topics(ACME)
    out = producer(cells.stack, "tools")
    await out.start()
    try:
        for i in range(FLOOD):
            await out.send(topics.schemas, b'{"junk": "%d"}' % i + b"x" * 200, key=b"%d" % (10_000_000 + i))
        await out.flush()
    finally:
        await out.stop()
    run_id = new_run_id()
    unknown = struct.pack(">bI", 0, 123_456_789) + b"\x02hi"
    where = await send(cells.stack, tenant_principal(ACME), topics.tasks, unknown, run_id, topics.partition_for(run_id))
    letter = await cells.dead_letter(ACME, topics.tasks, where, timeout=120)
    assert letter.error_kind == "unknown_schema", letter
    async with cells.client(ACME) as client:
        assert (await client.wait(await client.submit("What is 5 * 5?", tools=["calculator"], prefetch=False),
                                  timeout=60)).ok
    lines = [line for line in cells.log_text(*PLANNERS).splitlines() if f"{topics.schemas}@" in line]
    assert len(lines) < 50, f"{len(lines)} lines about skipped schema records, e.g. {lines[:3]}"
    assert "more records skipped in this read" in cells.log_text(*PLANNERS)

