"""docs/contract.md, "Examples": a task from Python with confluent-kafka and fastavro, no agentstream code.
Run from the repository's root: python examples/contract/python/submit.py [SESSION]."""
import hashlib
import io
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime

import fastavro
from confluent_kafka import Consumer, Producer, TopicPartition
from fastavro.schema import to_parsing_canonical_form

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or "127.0.0.1:17092"
PREFIX = os.environ.get("AGENTSTREAM_TOPIC_PREFIX", "")  # the deployment's topic prefix
SCHEMAS = os.environ.get("AGENTSTREAM_SCHEMAS_DIR") or "schemas"
WAIT_S = float(os.environ.get("WAIT_S") or 60)  # how long to wait for the outcome
TASKS, OUTCOMES = f"{PREFIX}agent.tasks", f"{PREFIX}agent.outcomes"


def load(record):
    """(schema id without a registry, parsed schema) of schemas/{record}.avsc."""
    with open(f"{SCHEMAS}/{record}.avsc") as f:
        schema = fastavro.parse_schema(json.load(f))
    digest = hashlib.sha256(to_parsing_canonical_form(schema).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF, schema


def encode(record, datum):
    schema_id, schema = load(record)
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))  # Confluent framing
    fastavro.schemaless_writer(out, schema, datum)
    return out.getvalue()


def murmur2(key):
    """Kafka's murmur2 hash of a key (bytes), as its default partitioner and librdkafka's murmur2_random use it."""
    m, h, cut = 0x5BD1E995, 0x9747B28C ^ len(key), len(key) - len(key) % 4
    for i in range(0, cut, 4):
        k = int.from_bytes(key[i:i + 4], "little") * m & 0xFFFFFFFF
        h = (h * m & 0xFFFFFFFF) ^ ((k ^ k >> 24) * m & 0xFFFFFFFF)
    if cut < len(key):
        h = (h ^ int.from_bytes(key[cut:], "little")) * m & 0xFFFFFFFF
    h = (h ^ h >> 13) * m & 0xFFFFFFFF
    return (h ^ h >> 15) & 0x7FFFFFFF


session = sys.argv[1] if len(sys.argv) > 1 else "example-session"  # the conversation this task is a turn of

# Read the outcomes from just before the task is sent: none can slip past.
consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "my-python-app", "enable.auto.commit": False})
since_ms = int(time.time() * 1000) - 1000
partitions = consumer.list_topics(OUTCOMES, timeout=10).topics[OUTCOMES].partitions
consumer.assign(consumer.offsets_for_times(
    [TopicPartition(OUTCOMES, p, since_ms) for p in partitions], timeout=10))

# A turn's run id must be on its session's partition (agent.tasks has as many as agent.outcomes): draw until it is.
run_id = f"run-{uuid.uuid4().hex[:16]}"
while murmur2(run_id.encode()) % len(partitions) != murmur2(session.encode()) % len(partitions):
    run_id = f"run-{uuid.uuid4().hex[:16]}"
task = {
    "event_id": str(uuid.uuid4()), "run_id": run_id, "step_id": f"{run_id}:task", "parent_step_id": None,
    "attempt": 0, "created_at": datetime.now(UTC),
    "producer": {"service": "my-python-app", "instance": "host-1"},
    # The [[...]] directives script the test model of `agentstream worker all` (--backend scripted), which
    # writes no JSON of its own; a real model needs only the question.
    "task": 'What is 6 * 7? [[tool:calculator {"expression": "6 * 7"}]] [[answer:{"result": 42}]]',
    "tools": ["calculator"], "max_steps": 8, "deadline": None, "model": None,
    "system_prompt": None, "metadata": {}, "prefetch": True, "on_tool_error": "tell_model", "replay_of": None,
    "output_schema": json.dumps({"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}),
    "max_tokens": None, "temperature": None, "top_p": None, "stop": [], "seed": None,
    "session": session, "tool_calling": None, "agent": None, "parent_run_id": None, "depth": 0,
}

producer = Producer({"bootstrap.servers": BOOTSTRAP, "partitioner": "murmur2_random", "enable.idempotence": True})
producer.produce(TASKS, key=run_id.encode(), value=encode("TaskSubmitted", task),
                 headers=[("agentstream-session", session.encode())])
if producer.flush(10):
    sys.exit(f"the task was not delivered to {TASKS} within 10 s")
print(f"run {run_id} submitted to {TASKS} (session {session})", flush=True)

# Wait for the run's outcome, with a timeout: a record the pipeline refuses is answered too (RunFailed
# invalid_task), so silence means no planner runs, or it is slow: see `agentstream dlq list` and its logs.
readers = {load(r)[0]: (r, load(r)[1]) for r in ("RunCompleted", "RunFailed")}
deadline = time.monotonic() + WAIT_S
while time.monotonic() < deadline:
    msg = consumer.poll(1.0)
    if msg is None or msg.error() or msg.key() != run_id.encode():
        continue
    value = msg.value()
    reader = readers.get(int.from_bytes(value[1:5], "big"))
    if reader is not None:
        record, schema = reader
        outcome = fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)
        consumer.close()
        if record == "RunFailed":
            sys.exit(f"RunFailed {outcome['error_code']}: {outcome['error']}")
        print(record, outcome["answer"])
        if outcome.get("output") is not None:  # JSON text, valid against output_schema
            print("result:", json.loads(outcome["output"])["result"])
        sys.exit(0)
consumer.close()
print(f"no outcome for {run_id} on {OUTCOMES} within {WAIT_S:.0f} s", file=sys.stderr)
sys.exit(2)
