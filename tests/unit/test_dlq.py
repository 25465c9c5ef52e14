"""Dead letters that always fit (streams/runtime/dead_letters.py): truncation, old letters, publishing through
outages; and what the operator sees of them (agentstream/ops/dlq.py)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import random
import struct
from datetime import UTC, datetime

import fastavro
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError

from agentstream.ops.dlq import REDRIVE_HEADER, LetterDetails, RedriveResult, StoredLetter, readable
from agentstream.streams.config.settings import Settings
from agentstream.streams.core import resources
from agentstream.streams.core.events import DeadLetter, Event
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry, schema_id
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime import dead_letters as dlq
from agentstream.streams.runtime.dead_letters import Rejected, dead_letter, publish_dead_letter, size_budgets

LIMIT = 512 * 1024


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(LocalRegistry())


def rejected(value: bytes | None, **overrides: object) -> Rejected:
    fields: dict = {"run_id": "run-1", "step": "dlq:agent.tasks:3:42", "service": "planner", "consumer": "planner",
                    "source_topic": "agent.tasks", "source_partition": 3, "source_offset": 42, "key": b"run-1",
                    "value": value, "headers": {"traceparent": b"00-abc-def-01"}, "error_kind": "undecodable",
                    "reason": "not in the Confluent wire format"}
    fields.update(overrides)
    return Rejected(**fields)


def test_a_letter_that_fits_is_whole_and_carries_the_digest(codec):
    value = b"\x01poison" * 10
    letter = dead_letter(rejected(value, reason="r" * 9000), codec, LIMIT)
    assert not letter.truncated
    assert letter.value == value and letter.key == b"run-1" and letter.headers == {"traceparent": b"00-abc-def-01"}
    assert letter.value_size == len(value) and letter.value_sha256 == hashlib.sha256(value).hexdigest()
    assert letter.reason == "r" * dlq.REASON_CHARS  # a reason is for people: always bounded
    assert codec.decode(codec.encode(letter)) == letter


def test_a_letter_too_large_keeps_a_prefix_with_the_original_size_and_digest(codec):
    value = random.Random(7).randbytes(2 * 1024 * 1024)
    headers = {f"h{i}": b"x" * 100_000 for i in range(100)}
    big = rejected(value, key=b"k" * 600_000, headers=headers, run_id="r" * 5000, reason="why " * 5000)
    letter = dead_letter(big, codec, LIMIT)
    encoded = codec.encode(letter)
    assert len(encoded) <= LIMIT
    assert letter.truncated
    assert letter.value is not None and value.startswith(letter.value)
    assert len(letter.value) > LIMIT - 80 * 1024  # the room left by the bounded parts goes to the value
    assert letter.value_size == len(value) and letter.value_sha256 == hashlib.sha256(value).hexdigest()
    assert len(letter.headers) == dlq.MAX_HEADERS
    assert all(len(v) == dlq.HEADER_VALUE_BYTES for v in letter.headers.values())
    assert letter.key == b"k" * dlq.KEY_BYTES and len(letter.run_id) == dlq.RUN_ID_CHARS
    assert len(letter.reason) == dlq.REASON_CHARS
    assert codec.decode(encoded) == letter  # what was sent is a valid letter


@pytest.mark.parametrize("limit", [1024, 4096, 64 * 1024, LIMIT])
def test_every_bound_is_kept(codec, limit):
    value = bytes(range(256)) * 4096  # 1 MiB
    letter = dead_letter(rejected(value, headers={"h": b"v" * 5000}, reason="x" * 4000), codec, limit)
    assert len(codec.encode(letter)) <= limit
    assert letter.truncated and value.startswith(letter.value or b"")
    assert letter.value_size == len(value)


def test_a_bound_below_the_minimal_letter_gives_the_minimal_letter(codec):
    value = b"v" * 10_000
    letter = dead_letter(rejected(value, reason="x" * 4000), codec, 0)
    assert letter.truncated and letter.value == b"" and letter.key is None and letter.headers == {}
    assert letter.reason == "x" * dlq.MINIMAL_REASON_CHARS
    assert letter.value_sha256 == hashlib.sha256(value).hexdigest()


def test_a_record_without_value_has_no_digest(codec):
    letter = dead_letter(rejected(None), codec, LIMIT)
    assert letter.value is None and letter.value_size is None and letter.value_sha256 is None


def test_letters_written_before_the_digest_fields_still_decode():
    """The DeadLetter schema before value_size / value_sha256 / truncated is kept in schemas/history."""
    old = json.loads((resources.schemas_dir() / "history" / "DeadLetter.v0.avsc").read_text())
    assert {f["name"] for f in old["fields"]}.isdisjoint({"value_size", "value_sha256", "truncated"})
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id(old)))
    fastavro.schemaless_writer(out, fastavro.parse_schema(old), {
        "event_id": "e", "run_id": "r", "step_id": "dlq:t:0:1", "parent_step_id": None, "attempt": 0,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC), "producer": {"service": "planner", "instance": "i"},
        "consumer": "planner", "source_topic": "t", "source_partition": 0, "source_offset": 1, "key": None,
        "value": b"old", "headers": {}, "error_kind": "undecodable", "reason": "old letter"})
    letter = Codec(LocalRegistry()).decode(out.getvalue())
    assert isinstance(letter, DeadLetter)
    assert letter.value == b"old" and letter.reason == "old letter"
    assert letter.value_size is None and letter.value_sha256 is None and letter.truncated is False


class FakeRuntime:
    """What publish_dead_letter uses of a Runtime; ``failures`` are raised by successive sends, either
    when queueing (``send`` raises) or from the acknowledgement (the future fails), alternately."""

    def __init__(self, codec: Codec, failures: list[Exception]) -> None:
        self.settings = Settings(kafka_bootstrap="unused:1", database_url="unused", max_event_bytes=LIMIT)
        self.codec = codec
        self.topics = Topics(prefix="t.")
        self.failures = failures
        self.sent: list[tuple[str, Event, str | None]] = []

    async def send(self, topic: str, event: Event, *, key: str | None = None,
                   headers: object = ()) -> asyncio.Future:
        self.sent.append((topic, event, key))
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        if not self.failures:
            future.set_result(None)
            return future
        failure = self.failures.pop(0)
        if len(self.sent) % 2:
            raise failure
        future.set_exception(failure)
        return future


@pytest.fixture
def no_waiting(monkeypatch):
    delays: list[int] = []

    def delay(failures: int) -> float:
        delays.append(failures)
        return 0.0

    monkeypatch.setattr(dlq, "backoff_delay", delay)
    return delays


async def test_publish_waits_out_an_outage_then_shrinks_on_refusal(codec, no_waiting):
    value = b"z" * (2 * 1024 * 1024)
    outage = [KafkaTimeoutError(), KafkaConnectionError(), KafkaTimeoutError()] * 3  # nine failed tries
    runtime = FakeRuntime(codec, [*outage, MessageSizeTooLargeError()])
    letter = await publish_dead_letter(runtime, rejected(value))  # type: ignore[arg-type]
    assert len(runtime.sent) == 11 and no_waiting == list(range(1, 10))  # each outage failure waited, not the refusal
    sizes = [len(codec.encode(event)) for _, event, _ in runtime.sent]
    assert all(s <= LIMIT for s in sizes[:10]) and sizes[10] <= size_budgets(LIMIT)[1]
    assert runtime.sent[-1] == ("t.agent.dlq", letter, "run-1")
    assert letter.truncated and letter.value_size == len(value)


async def test_refusals_past_the_minimal_letter_are_retried_not_raised(codec, no_waiting):
    runtime = FakeRuntime(codec, [MessageSizeTooLargeError() for _ in range(5)])
    letter = await publish_dead_letter(runtime, rejected(b"v" * 10))  # type: ignore[arg-type]
    assert len(runtime.sent) == 6
    assert letter.value == b"" and letter.headers == {}  # the minimal letter, sent once the broker took it
    assert no_waiting == [3, 4, 5]  # the first two refusals moved to smaller letters at once


def test_backoff_is_capped():
    assert all(dlq.MAX_BACKOFF_S / 2 <= dlq.backoff_delay(n) <= dlq.MAX_BACKOFF_S for n in (20, 1000))
    assert dlq.backoff_delay(1) <= dlq.BACKOFF_S


# -- what the operator sees (agentstream/ops/dlq_letters.py) ---------------------------------------------

def test_bytes_are_shown_as_text_when_they_are_text_else_as_base64():
    assert readable(None) is None
    assert readable("line one\n\tline two é".encode()) == "line one\n\tline two é"
    assert readable(b"\x00\x01bin") == "base64:AAFiaW4="
    assert readable(b"\xff\xfe") == "base64://4="


def test_a_stored_letter_is_summarised_with_where_it_came_from_and_what_it_was_redriven_from(codec):
    letter = dead_letter(rejected(b"v", headers={REDRIVE_HEADER: b"t.agent.dlq:0:3"}), codec, LIMIT)
    stored = StoredLetter("t.agent.dlq", 0, 9, datetime(2026, 1, 2, tzinfo=UTC), letter, redrives=1)
    summary = stored.summary()
    assert stored.address == "t.agent.dlq:0:9"
    assert summary["source_topic"] == "agent.tasks" and summary["source_offset"] == 42
    assert summary["redrive_of"] == "t.agent.dlq:0:3" and summary["redrives"] == 1
    details = LetterDetails(stored, None, "does not decode", []).as_dict()
    assert details["value_base64"] == "dg==" and details["headers"] == {REDRIVE_HEADER: "t.agent.dlq:0:3"}
    assert details["original"] is None and details["original_problem"] == "does not decode"
    broken = StoredLetter("t.agent.dlq", 0, 10, datetime(2026, 1, 2, tzinfo=UTC), None, "a TaskSubmitted").summary()
    assert broken["problem"] == "a TaskSubmitted" and "source_topic" not in broken


def test_a_redrive_is_ok_unless_refused_or_failed():
    assert [RedriveResult(0, action, "").ok for action in ("redriven", "would_redrive", "skipped", "refused", "failed")
            ] == [True, True, True, False, False]
