"""Poison records for the chaos suite: into every input topic, three kinds each, recorded where they land.

- ``random_bytes``: not an event at all (not even the wire format's magic byte, as a rule);
- ``large_gzip``: a valid event of the topic's type whose text is ``POISON_LARGE_BYTES`` of a repeated
  phrase, sent with gzip and a large ``max_request_size``, so the broker takes it (the compressed batch
  is small) but the event is twice what a service may publish (a request or result built from it, or
  its dead letter carrying the original bytes, is larger than the broker accepts);
- ``nul_text``: a valid event whose text holds a NUL character, which PostgreSQL refuses in text and
  JSON (every service that records the event must cope).

Each record is keyed by a run id of its own (``poison-…``), never one of the suite's runs, and its
topic, partition and offset are recorded, so its dead letter (``DeadLetter.source_*``) is told apart
from a dead letter of real traffic.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaProducer

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.events import (
    Event,
    InferenceCompleted,
    InferenceRequested,
    Message,
    Passage,
    RetrievalCompleted,
    RetrievalRequested,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.topics import Topics

POISON_PREFIX = "poison-"
POISON_LARGE_BYTES = 2 * 1024 * 1024
RANDOM_BYTES = 512
#: Large enough for the large poison uncompressed (the producer checks the uncompressed size).
PRODUCER_MAX_REQUEST_BYTES = 4 * POISON_LARGE_BYTES
NUL_TEXT = "before the NUL\x00after the NUL"
#: A poison task still gets a deadline, so a run started from one cannot linger.
POISON_DEADLINE_S = 60.0
KINDS = ("random_bytes", "large_gzip", "nul_text")


@dataclass(frozen=True)
class Injected:
    kind: str
    topic: str
    partition: int
    offset: int
    run_id: str
    bytes: int

    @property
    def source(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)

    def public(self) -> dict:
        return asdict(self)


def input_topics(topics: Topics) -> dict[str, str]:
    """Every topic a service consumes requests or results from, by role."""
    return {"tasks": topics.tasks, "inference_requests": topics.inference_requests,
            "inference_results": topics.inference_results, "tool_requests": topics.tool_requests,
            "tool_results": topics.tool_results, "retrieval_requests": topics.retrieval_requests,
            "retrieval_results": topics.retrieval_results}


def large_text() -> str:
    phrase = "chaos poison payload "
    return (phrase * (POISON_LARGE_BYTES // len(phrase) + 1))[:POISON_LARGE_BYTES]


def poison_event(role: str, run_id: str, text: str) -> Event:
    """A valid event of the type ``role``'s topic carries, whose free text is ``text``."""
    common = {"run_id": run_id, "service": "chaos-poison"}
    step = f"{run_id}:0:poison"
    if role == "tasks":
        deadline = datetime.now(UTC) + timedelta(seconds=POISON_DEADLINE_S)
        return TaskSubmitted.build(step=f"{run_id}:task", task=text, tools=[], max_steps=2, deadline=deadline,
                                   prefetch=False, **common)
    if role == "inference_requests":
        return InferenceRequested.build(step=step, messages=[Message(role="user", content=text)], **common)
    if role == "inference_results":
        return InferenceCompleted.build(step=step, text=text, finish_reason="stop", **common)
    if role == "tool_requests":
        return ToolCallRequested.build(step=step, tool="chaos_echo", arguments=json.dumps({"text": text}), **common)
    if role == "tool_results":
        return ToolCallCompleted.build(step=step, tool="chaos_echo", ok=True, result=json.dumps(text), **common)
    if role == "retrieval_requests":
        return RetrievalRequested.build(step=step, query=text, **common)
    if role == "retrieval_results":
        return RetrievalCompleted.build(step=step, passages=[Passage(id="poison", text=text, score=1.0)], **common)
    raise ValueError(f"no poison event for {role}")


def _value(kind: str, role: str, run_id: str, codec: Codec) -> bytes:
    if kind == "random_bytes":
        return os.urandom(RANDOM_BYTES)
    text = large_text() if kind == "large_gzip" else NUL_TEXT
    return codec.encode(poison_event(role, run_id, text))


async def inject(bootstrap: str, topics: Topics, codec: Codec, auth: KafkaAuth | None = None) -> list[Injected]:
    """Send every kind of poison to every input topic; return where each record landed (on a secure stack
    as ``auth``: the administrator, standing in for a service that went wrong)."""
    producer = AIOKafkaProducer(**kafka_options(bootstrap, auth or KafkaAuth()), acks="all", compression_type="gzip",
                                max_request_size=PRODUCER_MAX_REQUEST_BYTES, request_timeout_ms=30_000)
    await producer.start()
    injected: list[Injected] = []
    try:
        for role, topic in input_topics(topics).items():
            for kind in KINDS:
                run_id = f"{POISON_PREFIX}{kind.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
                value = _value(kind, role, run_id, codec)
                meta = await producer.send_and_wait(topic, value, key=run_id.encode())
                injected.append(Injected(kind, topic, meta.partition, meta.offset, run_id, len(value)))
    finally:
        await producer.stop()
    return injected
