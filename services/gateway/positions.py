"""Where a run's event stream is: the SSE ``id`` of every event, and what ``Last-Event-ID`` resumes from.

A run's events are on one partition number of several topics (docs/contract.md, "Keys and partitions"):
its tokens, its model replies, its tool and retrieval results and its outcome. A position is that
partition and, for each of those topics, the next offset to read: ``"<partition>.<o1>.<o2>.<o3>.<o4>.<o5>"``
in the order of ``STREAM_TOPICS``. The id of an event is the position just after it, so a client that
comes back with the last id it saw resumes exactly there, on any replica, with nothing lost and nothing
repeated: the id is a place in Kafka, not a counter one gateway process kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: The topics a run's stream follows (``Topics`` attribute names), in the order positions list them.
STREAM_TOPICS: tuple[str, ...] = ("tokens", "inference_results", "tool_results", "retrieval_results", "outcomes")
TOKENS, MODEL, TOOL, RETRIEVAL, OUTCOME = range(len(STREAM_TOPICS))
_MAX_PARTS = len(STREAM_TOPICS) + 1


class BadPosition(ValueError):
    """A ``Last-Event-ID`` that is not a position this gateway wrote."""


@dataclass(frozen=True)
class Position:
    """The run's partition and the next offset to read in each of ``STREAM_TOPICS``."""

    partition: int
    offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.offsets) != len(STREAM_TOPICS):
            raise BadPosition(f"a position has {len(STREAM_TOPICS)} offsets, not {len(self.offsets)}")

    def encode(self) -> str:
        return ".".join(str(n) for n in (self.partition, *self.offsets))

    @classmethod
    def decode(cls, text: str) -> Position:
        parts = text.strip().split(".")
        if len(parts) != _MAX_PARTS or not all(p.isdigit() and len(p) <= 19 for p in parts):
            raise BadPosition(f"{text[:80]!r} is not an event id of this stream "
                              f"(expected {_MAX_PARTS} non-negative integers joined by '.')")
        numbers = [int(p) for p in parts]
        return cls(numbers[0], tuple(numbers[1:]))

    def after(self, topic: int, offset: int) -> Position:
        """The position once the record at ``offset`` of ``STREAM_TOPICS[topic]`` has been read."""
        if offset < self.offsets[topic]:
            return self
        offsets = list(self.offsets)
        offsets[topic] = offset + 1
        return replace(self, offsets=tuple(offsets))

    def covers(self, topic: int, offset: int) -> bool:
        """Whether the record at ``offset`` is before this position (already read)."""
        return offset < self.offsets[topic]

    def at_least(self, other: Position) -> bool:
        return all(a >= b for a, b in zip(self.offsets, other.offsets, strict=True))

    def merge(self, other: Position) -> Position:
        """The later of the two, topic by topic."""
        return replace(self, offsets=tuple(max(a, b) for a, b in zip(self.offsets, other.offsets, strict=True)))


__all__ = ["MODEL", "OUTCOME", "RETRIEVAL", "STREAM_TOPICS", "TOKENS", "TOOL", "BadPosition", "Position"]
