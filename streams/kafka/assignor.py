"""Co-partitioned, sticky partition assignment for consumer groups that join topics by run.

The planner reads four topics keyed by run id (tasks and the three result topics). A run's events land
on the same partition *number* of each, and the planner keeps the run's state in memory, so partition
``p`` of every one of those topics must belong to the same member. aiokafka's default (round-robin over
all topic-partitions) breaks that as soon as a group has three members: ``tasks[p]`` and
``tool.results[p]`` end up on different planners, one of which holds a stale copy of the run.

This assignor hands out partition *numbers*: a member that gets number ``p`` gets ``p`` of every topic
it subscribes to. It is also sticky: each member tells the leader which numbers it owns (in its
subscription's user data), and the leader keeps them where they are as far as the balance allows, so
a scale-up, a scale-down or a rolling restart moves only the partitions it must (the planner keeps the
cached runs of partitions it still owns, and an inference worker keeps its prompt cache warm).

aiokafka calls assignors through class methods, so each consumer gets its own subclass
(:func:`copartitioned`) to remember what it owns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

log = logging.getLogger(__name__)


class CopartitionedAssignor(AbstractPartitionAssignor):
    """Partition numbers, not topic-partitions, are the unit of assignment (see the module docstring)."""

    name = "agentstream-copartitioned"
    version = 0
    #: The partition numbers this consumer owns (per subclass: see ``copartitioned()``).
    owned: frozenset[int] = frozenset()

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        user_data = json.dumps(sorted(cls.owned)).encode()
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), user_data)

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        cls.owned = frozenset(p for _topic, partitions in assignment.assignment for p in partitions)

    @classmethod
    def assign(cls, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata],
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        counts: dict[str, int] = {}
        for metadata in members.values():
            for topic in metadata.subscription:
                partitions = cluster.partitions_for_topic(topic)
                if partitions is None:
                    log.warning("no partition metadata for topic %s yet; it is left out of this assignment", topic)
                    continue
                counts[topic] = len(partitions)
        if len(set(counts.values())) > 1:
            log.error("co-partitioned topics have different partition counts (%s): a run's events may be split "
                      "across members", counts)
        numbers = range(max(counts.values(), default=0))
        previous = {member: _owned(metadata.user_data) for member, metadata in members.items()}
        plan = balance(list(numbers), previous)
        out: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member, metadata in members.items():
            mine = plan.get(member, [])
            topics = [(t, [p for p in mine if p < counts[t]]) for t in sorted(metadata.subscription) if t in counts]
            out[member] = ConsumerProtocolMemberAssignment(cls.version, topics, b"")
        return out


def balance(numbers: list[int], previous: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """Give each member ``len(numbers) // len(members)`` numbers (the first few one more), keeping
    what each member owned before where the quotas allow. Deterministic for the same input."""
    members = sorted(previous)
    if not members:
        return {}
    valid = set(numbers)
    claimed: set[int] = set()
    kept: dict[str, list[int]] = {}
    for member in members:  # a number two members claim (a stale member) goes to the first
        mine = sorted(p for p in set(previous[member]) if p in valid and p not in claimed)
        claimed.update(mine)
        kept[member] = mine
    base, extra = divmod(len(numbers), len(members))
    # The members that already hold the most get the extra numbers: fewer moves.
    ranked = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}
    plan = {m: kept[m][: quota[m]] for m in members}
    taken = {p for mine in plan.values() for p in mine}
    free = [p for p in numbers if p not in taken]
    for member in members:
        while len(plan[member]) < quota[member]:
            plan[member].append(free.pop(0))
        plan[member].sort()
    return plan


def _owned(user_data: bytes | None) -> list[int]:
    try:
        value = json.loads(user_data or b"[]")
    except ValueError:
        return []
    return [p for p in value if isinstance(p, int)] if isinstance(value, list) else []


def copartitioned() -> type[CopartitionedAssignor]:
    """An assignor class of its own for one consumer (it remembers that consumer's partitions)."""
    return type("CopartitionedAssignor", (CopartitionedAssignor,), {"owned": frozenset()})


__all__ = ["CopartitionedAssignor", "balance", "copartitioned"]
