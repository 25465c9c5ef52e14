"""docs/contract.md, "With a schema registry": a task from Python through a Confluent-compatible registry
(Confluent, Karapace, Apicurio's /apis/ccompat/v7) with confluent-kafka's AvroSerializer, no agentstream code.
The deployment must use the same registry (AGENTSTREAM_SCHEMA_REGISTRY_URL on every agentstream process):
its workers register the schemas this example writes and reads with. Run from the repository's root:
SCHEMA_REGISTRY_URL=http://HOST:8080/apis/ccompat/v7 python examples/contract/python/submit_registry.py"""
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or "127.0.0.1:17092"
PREFIX = os.environ.get("AGENTSTREAM_TOPIC_PREFIX", "")  # the deployment's topic prefix
SCHEMAS = os.environ.get("AGENTSTREAM_SCHEMAS_DIR") or "schemas"
REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL") or "http://127.0.0.1:8080/apis/ccompat/v7"
WAIT_S = float(os.environ.get("WAIT_S") or 60)  # how long to wait for the outcome
TASKS, OUTCOMES = f"{PREFIX}agent.tasks", f"{PREFIX}agent.outcomes"

registry = SchemaRegistryClient({"url": REGISTRY})
with open(f"{SCHEMAS}/TaskSubmitted.avsc") as f:
    # The subject is the record's full name (RecordNameStrategy); write with the version agentstream registered.
    serialize = AvroSerializer(registry, f.read(), conf={
        "subject.name.strategy": record_subject_name_strategy,
        "auto.register.schemas": False, "use.latest.version": True})
deserialize = AvroDeserializer(registry)  # any id the registry knows: RunCompleted, RunFailed

# Read the outcomes from just before the task is sent: none can slip past.
consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "my-python-app", "enable.auto.commit": False})
since_ms = int(time.time() * 1000) - 1000
partitions = consumer.list_topics(OUTCOMES, timeout=10).topics[OUTCOMES].partitions
consumer.assign(consumer.offsets_for_times([TopicPartition(OUTCOMES, p, since_ms) for p in partitions], timeout=10))

run_id = f"run-{uuid.uuid4().hex[:16]}"  # a run on its own (no session): any unique id
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
    "session": None, "tool_calling": None, "agent": None, "parent_run_id": None, "depth": 0,
}
producer = Producer({"bootstrap.servers": BOOTSTRAP, "partitioner": "murmur2_random", "enable.idempotence": True})
producer.produce(TASKS, key=run_id.encode(), value=serialize(task, SerializationContext(TASKS, MessageField.VALUE)))
if producer.flush(10):
    sys.exit(f"the task was not delivered to {TASKS} within 10 s")
print(f"run {run_id} submitted to {TASKS}", flush=True)

# Wait for the run's outcome, with a timeout: a record the pipeline refuses is answered too (RunFailed
# invalid_task), so silence means no planner runs, or it is slow: see `agentstream dlq list` and its logs.
deadline = time.monotonic() + WAIT_S
while time.monotonic() < deadline:
    msg = consumer.poll(1.0)
    if msg is None or msg.error() or msg.key() != run_id.encode():
        continue
    outcome = deserialize(msg.value(), SerializationContext(OUTCOMES, MessageField.VALUE))
    consumer.close()
    if "error_code" in outcome:  # RunFailed
        sys.exit(f"RunFailed {outcome['error_code']}: {outcome['error']}")
    print("RunCompleted", outcome["answer"])
    if outcome.get("output") is not None:  # JSON text, valid against output_schema
        print("result:", json.loads(outcome["output"])["result"])
    sys.exit(0)
consumer.close()
print(f"no outcome for {run_id} on {OUTCOMES} within {WAIT_S:.0f} s", file=sys.stderr)
sys.exit(2)
