"""The autoscaling signal: prompt tokens waiting in the inference backlog, not just messages.

Message counts are a poor signal for a model server: one request can be 50 prompt tokens or 8,000.
Every ``InferenceRequested`` carries its estimated prompt tokens in a header: whoever publishes model
requests (the planner; a benchmark that publishes them itself) registers ``prompt_tokens_header`` on its
``Runtime`` (``add_header_hook``), which adds it to each one sent. The backlog of a partition is the sum of that
header over the records between the inference group's committed offset and the partition's end.

Summing those headers naively means rereading the backlog on every sample. ``BacklogSampler`` is
incremental instead, and exact: per partition it keeps ``(offset, tokens)`` for the records between the
committed offset and how far it has read, and on each sample

1. fetches the group's committed offsets and the end offsets (two small requests);
2. drops the entries below the committed offset (the inference workers finished them) and, when the
   consumers are ahead of it, seeks straight to the committed offset — records consumed between two
   samples are never read at all;
3. reads only the records appended since its last sample.

So each record is read at most once, and only if it was still waiting at a sample: when inference keeps
up, the sampler reads almost nothing; when it falls behind, it reads each new request once (the same
bytes the inference workers read, once). Memory is two integers per waiting request.

It runs in the planner's worker (always up, also when inference is scaled to zero, which is exactly
when the signal matters) and covers the partitions that planner instance owns — the planner owning
partition p of its inputs publishes the requests of partition p — so ``sum()`` over planner instances
is the whole backlog, with no double counting and no coordination.

The estimate is characters / 4 plus 4 tokens per message (chat template); ``InferenceCompleted``'s
``prompt_tokens`` against it tells how good it is for a given model.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiokafka import TopicPartition

from agentstream.streams.core.events import InferenceRequested
from agentstream.streams.telemetry.lag import GroupOffsets

if TYPE_CHECKING:
    from agentstream.streams.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

#: Header on every InferenceRequested: its estimated prompt tokens (ASCII decimal).
PROMPT_TOKENS_HEADER = "agentstream-prompt-tokens"


def estimate_prompt_tokens(event: InferenceRequested) -> int:
    """Characters / 4 (English text with BPE tokenizers) plus 4 per message for the chat template."""
    return sum(len(m.content) for m in event.messages) // 4 + 4 * len(event.messages)


def prompt_tokens_header(event: InferenceRequested) -> list[tuple[str, bytes]]:
    """The header a model request is published with, its estimated prompt tokens: the producer of
    model requests (the planner) registers it with ``Runtime.add_header_hook``, so the transport itself
    knows no event type."""
    return [(PROMPT_TOKENS_HEADER, b"%d" % estimate_prompt_tokens(event))]


def record_tokens(headers: Iterable[tuple[str, bytes]] | None, value: bytes | None) -> int:
    """The header's estimate, or bytes / 4 of the value for a request published without one."""
    for key, raw in headers or ():
        if key == PROMPT_TOKENS_HEADER:
            try:
                return int(raw)
            except ValueError:
                break
    return len(value or b"") // 4


@dataclass
class _Partition:
    position: int  # the next offset to read
    entries: deque[tuple[int, int]] = field(default_factory=deque)  # (offset, tokens) still waiting
    tokens: int = 0


class BacklogSampler:
    """Exports ``agentstream_inference_backlog_prompt_tokens`` / ``_requests`` for the owned partitions."""

    def __init__(self, offsets: GroupOffsets, topic: str, group: str, partitions: Callable[[], set[int]],
                 metrics: Metrics | None = None, *, read_budget_s: float = 2.0) -> None:
        self.offsets = offsets
        self.topic = topic
        self.group = group
        self.partitions = partitions
        self.metrics = metrics
        self.read_budget_s = read_budget_s
        self._parts: dict[TopicPartition, _Partition] = {}
        #: Records read in all (tests and the benchmark check the sampler's cost).
        self.records_read = 0

    async def sample(self) -> tuple[int, int]:
        """One sample: (prompt tokens, requests) waiting in the owned partitions."""
        tps = [TopicPartition(self.topic, p) for p in sorted(self.partitions())]
        for tp in set(self._parts) - set(tps):
            del self._parts[tp]
        positions = await self.offsets.positions(self.group, tps)
        targets: dict[TopicPartition, int] = {}
        for tp, (committed, end) in positions.items():
            part = self._parts.get(tp)
            if part is None:
                part = self._parts[tp] = _Partition(position=committed)
            while part.entries and part.entries[0][0] < committed:
                part.tokens -= part.entries.popleft()[1]
            if part.position < committed:  # consumed before we read them: nothing to read there
                part.position = committed
            if part.position < end:
                targets[tp] = end
        if targets:
            await self._read(targets)
        tokens = sum(p.tokens for p in self._parts.values())
        requests = sum(len(p.entries) for p in self._parts.values())
        if self.metrics is not None:
            self.metrics.backlog_tokens.set(tokens)
            self.metrics.backlog_requests.set(requests)
        return tokens, requests

    async def _read(self, targets: dict[TopicPartition, int]) -> None:
        consumer = self.offsets.consumer
        assert consumer is not None
        consumer.assign(list(targets))
        for tp in targets:
            consumer.seek(tp, self._parts[tp].position)
        remaining = set(targets)
        deadline = time.monotonic() + self.read_budget_s
        while remaining and time.monotonic() < deadline:
            batch = await consumer.getmany(*remaining, timeout_ms=100, max_records=5000)
            for tp, messages in batch.items():
                part = self._parts[tp]
                for msg in messages:
                    if msg.offset < part.position:
                        continue
                    tokens = record_tokens(msg.headers, msg.value)
                    part.entries.append((msg.offset, tokens))
                    part.tokens += tokens
                    part.position = msg.offset + 1
                self.records_read += len(messages)
            remaining = {tp for tp in remaining if self._parts[tp].position < targets[tp]}
        if remaining:  # the rest next time: the gauge under-reports until then
            log.info("inference backlog: %d partitions not read up to their end within %.1f s",
                     len(remaining), self.read_budget_s)


__all__ = ["PROMPT_TOKENS_HEADER", "BacklogSampler", "estimate_prompt_tokens", "prompt_tokens_header", "record_tokens"]
