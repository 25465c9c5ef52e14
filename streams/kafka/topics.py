"""The topic catalogue: every topic agentstream uses, with its partitions and configs
(creating them on a broker: ``streams/kafka/topic_admin.py``).

Topics are created on purpose, from this catalogue only, so a typo never creates a topic and a compacted
topic is never created as a deleting one: our brokers have ``auto.create.topics.enable=false``, and on one
that does not, no agentstream client asks for a topic to be created (``streams/config/kafka_defaults.py``) and
``ensure_topics`` repairs or refuses a topic someone else's client created. Names are built by ``Topics``
from an optional prefix, which isolates tests and replays.
"""

from __future__ import annotations

import functools
import logging
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiokafka.partitioner import murmur2

from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.core.errors import AgentStreamError
from agentstream.streams.kafka.schema_guard import MAX_SCHEMA_BYTES

if TYPE_CHECKING:
    from agentstream.streams.config.settings import Settings

log = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000


@functools.lru_cache(maxsize=1 << 15)
def key_hash(key: bytes) -> int:
    """``murmur2(key) & 0x7fffffff``: Kafka's default partitioner's hash of a record key, remembered. A
    run's key is hashed many times (every event of the run, by the producer and by the runtime's routing)
    and aiokafka's murmur2 is pure Python (5 µs a key on this machine; a cache hit is 0.1 µs)."""
    return murmur2(key) & 0x7FFFFFFF


def key_partitioner(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """aiokafka's ``DefaultPartitioner`` with ``key_hash``: the same partition for every key (the producers'
    ``partitioner``). A record without a key goes to a random available partition, as there."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[key_hash(key) % len(all_partitions)]


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replication_factor: int = 1
    configs: Mapping[str, str] = field(default_factory=dict)


def _retention(days: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(days * DAY_MS)}


@dataclass(frozen=True)
class Topics:
    """Names of agentstream's topics and consumer groups under one prefix."""

    prefix: str = ""
    partitions: int = 8
    replication_factor: int = 1

    @classmethod
    def of(cls, settings: Settings) -> Topics:
        """The topics ``settings`` name: their prefix, partitions and replication."""
        return cls(prefix=settings.topic_prefix, partitions=settings.partitions,
                   replication_factor=settings.replication_factor)

    def _t(self, name: str) -> str:
        return f"{self.prefix}agent.{name}"

    @property
    def tasks(self) -> str:
        return self._t("tasks")

    @property
    def inference_requests(self) -> str:
        return self._t("inference.requests")

    @property
    def inference_results(self) -> str:
        return self._t("inference.results")

    @property
    def tokens(self) -> str:
        return self._t("tokens")

    @property
    def retrieval_requests(self) -> str:
        return self._t("retrieval.requests")

    @property
    def retrieval_results(self) -> str:
        return self._t("retrieval.results")

    @property
    def tool_requests(self) -> str:
        return self._t("tool.requests")

    @property
    def tool_results(self) -> str:
        return self._t("tool.results")

    @property
    def runs(self) -> str:
        return self._t("runs")

    @property
    def outcomes(self) -> str:
        return self._t("outcomes")

    @property
    def dlq(self) -> str:
        return self._t("dlq")

    @property
    def alerts(self) -> str:
        """AlertRaised events from the alerting app (services/alerts)."""
        return self._t("alerts")

    @property
    def tools(self) -> str:
        """ToolRegistered events, key: the tool's name (compacted: the latest registration of each tool)."""
        return self._t("tools")

    @property
    def agents(self) -> str:
        """AgentRegistered events, key: ``{name}@{version}:{digest}`` (compacted: every distinct registration;
        streams/catalog/agents.py)."""
        return self._t("agents")

    @property
    def schemas(self) -> str:
        """The Avro schemas processes write with, key: the schema id (compacted; streams/kafka/schema_log.py)."""
        return self._t("schemas")

    @property
    def sessions(self) -> str:
        """SessionUpdated events, key: the session id (compacted: each session's latest transcript; a
        deleted session's tombstone)."""
        return self._t("sessions")

    def partition_for(self, run_id: str) -> int:
        """The partition of every run-keyed topic that carries ``run_id`` (Kafka's default partitioner)."""
        return key_hash(run_id.encode()) % self.partitions

    def run_id_for_session(self, session: str, *, tries: int = 10_000) -> str:
        """A new run id on ``session``'s partition (``partition_for(session)``), for a turn of the session:
        every event of every turn then lands on one partition, so one planner owns the session and orders
        its turns. Random ids are drawn until one hashes there (``partitions`` draws on average)."""
        wanted = self.partition_for(session)
        for _ in range(tries):
            run_id = f"run-{uuid.uuid4().hex[:16]}"
            if self.partition_for(run_id) == wanted:
                return run_id
        raise AgentStreamError(f"no run id on partition {wanted} after {tries} draws")  # (1 in e^1250 with 8)

    def group(self, service: str) -> str:
        """The consumer group of a service."""
        return f"{self.prefix}agentstream.{service}"

    @property
    def planner_inputs(self) -> list[str]:
        """Co-partitioned: a run's events land on the same partition number of each."""
        return [self.tasks, self.inference_results, self.retrieval_results, self.tool_results]

    async def delete_all(self, bootstrap: str, *, auth: KafkaAuth) -> None:
        """Delete every catalogue topic under this prefix (tests, replays, benchmarks clean up after
        themselves). Refuses without a prefix: those are the production topics."""
        if not self.prefix:
            raise AgentStreamError("refusing to delete unprefixed (production) topics")
        from agentstream.streams.kafka.topic_admin import (
            delete_topics,  # (the admin module builds on this one)
        )

        await delete_topics(bootstrap, [s.name for s in self.specs()], auth=auth)

    def specs(self) -> list[TopicSpec]:
        n, rf = self.partitions, self.replication_factor
        run_keyed = [
            (self.tasks, _retention(7)),
            (self.inference_requests, _retention(7)),
            (self.inference_results, _retention(7)),
            (self.tokens, _retention(1)),
            (self.retrieval_requests, _retention(7)),
            (self.retrieval_results, _retention(7)),
            (self.tool_requests, _retention(7)),
            (self.tool_results, _retention(7)),
            (self.outcomes, _retention(7)),
            (self.runs, {
                "cleanup.policy": "compact",
                "min.cleanable.dirty.ratio": "0.1",
                "segment.ms": str(3600 * 1000),
                "delete.retention.ms": str(DAY_MS),
            }),
            # Keyed by session id, whose partition is its turns' (``run_id_for_session``).
            (self.sessions, {
                "cleanup.policy": "compact",
                "min.cleanable.dirty.ratio": "0.1",
                "segment.ms": str(3600 * 1000),
                "delete.retention.ms": str(DAY_MS),
            }),
        ]
        # Replicated: a write (acks=all) needs all replicas but one, so one broker may be down.
        isr = {"min.insync.replicas": str(rf - 1)} if rf > 1 else {}
        specs = [TopicSpec(name, n, rf, {**configs, **isr}) for name, configs in run_keyed]
        specs.append(TopicSpec(self.dlq, 1, rf, {**_retention(30), **isr}))
        specs.append(TopicSpec(self.alerts, 1, rf, {**_retention(30), **isr}))  # few, and in one order
        specs.append(TopicSpec(self.tools, 1, rf, {"cleanup.policy": "compact", **isr}))  # read whole, from the start
        specs.append(TopicSpec(self.agents, 1, rf, {"cleanup.policy": "compact", **isr}))  # likewise
        # Read whole, likewise; a record holds one schema, which readers refuse over MAX_SCHEMA_BYTES anyway.
        specs.append(TopicSpec(self.schemas, 1, rf, {"cleanup.policy": "compact",
                                                     "max.message.bytes": str(2 * MAX_SCHEMA_BYTES), **isr}))
        return specs
