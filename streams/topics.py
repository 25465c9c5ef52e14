"""The topic catalogue: every topic agentstream uses, with its partitions and configs, and its creation.

Topics are created on purpose (the broker has ``auto.create.topics.enable=false``), from this catalogue
only, so a typo never creates a topic and a compacted topic is never created as a deleting one.
Names are built by ``Topics`` from an optional prefix, which isolates tests and replays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CoordinatorNotAvailableError, for_code
from aiokafka.partitioner import murmur2

from streams.errors import AgentStreamError

_TOPIC_ALREADY_EXISTS = 36
DAY_MS = 24 * 3600 * 1000


class TopicMismatch(AgentStreamError):
    """An existing topic has a different partition count than its specification."""


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

    def partition_for(self, run_id: str) -> int:
        """The partition of every run-keyed topic that carries ``run_id`` (Kafka's default partitioner)."""
        return (murmur2(run_id.encode()) & 0x7FFFFFFF) % self.partitions

    def group(self, service: str) -> str:
        """The consumer group of a service."""
        return f"{self.prefix}agentstream.{service}"

    @property
    def planner_inputs(self) -> list[str]:
        """Co-partitioned: a run's events land on the same partition number of each."""
        return [self.tasks, self.inference_results, self.retrieval_results, self.tool_results]

    async def delete_all(self, bootstrap: str) -> None:
        """Delete every catalogue topic under this prefix (tests, replays, benchmarks clean up after
        themselves). Refuses without a prefix: those are the production topics."""
        if not self.prefix:
            raise AgentStreamError("refusing to delete unprefixed (production) topics")
        await delete_topics(bootstrap, [s.name for s in self.specs()])

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
        ]
        specs = [TopicSpec(name, n, rf, configs) for name, configs in run_keyed]
        specs.append(TopicSpec(self.dlq, 1, rf, _retention(30)))
        specs.append(TopicSpec(self.alerts, 1, rf, _retention(30)))  # few, and in one order
        return specs


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], *, timeout_ms: int = 30000) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Raises ``TopicMismatch`` when an existing topic has fewer or more partitions than specified
    (keys would hash to other partitions than the code expects), and the broker's error for any
    other failure.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs)) for s in specs],
            timeout_ms=timeout_ms,
        )
        created: list[str] = []
        existing: list[str] = []
        for entry in response.topic_errors:
            name, code = entry[0], entry[1]
            if code == 0:
                created.append(name)
            elif code == _TOPIC_ALREADY_EXISTS:
                existing.append(name)
            else:
                message = entry[2] if len(entry) > 2 else ""
                raise for_code(code)(f"creating topic {name}: {message}")
        if existing:
            wanted = {s.name: s.partitions for s in specs}
            for description in await _describe_settled(admin, existing, within_s=timeout_ms / 1000):
                have = len(description["partitions"])
                if have != wanted[description["topic"]]:
                    raise TopicMismatch(
                        f"topic {description['topic']} has {have} partitions, the catalogue says "
                        f"{wanted[description['topic']]}; migrate it (or delete it in development)"
                    )
        return created
    finally:
        await admin.close()


async def _describe_settled(admin: AIOKafkaAdminClient, names: list[str], *, within_s: float) -> list[dict]:
    """The topics' descriptions once the broker knows them all. A topic created a moment ago (by
    another process, e.g. ``dev up`` just before a worker starts) can be described with an error
    and no partitions until the broker's metadata catches up with the controller: ask again."""
    deadline = time.monotonic() + within_s
    while True:
        descriptions = await admin.describe_topics(names)
        unsettled = [d for d in descriptions if d["error_code"] or not d["partitions"]]
        if not unsettled:
            return descriptions
        if time.monotonic() > deadline:
            first = unsettled[0]
            if first["error_code"]:
                raise for_code(first["error_code"])(f"describing topic {first['topic']}")
            raise TopicMismatch(f"topic {first['topic']} has no partitions")
        await asyncio.sleep(0.1)


async def wait_for_group_coordinator(bootstrap: str, *, within_s: float = 30.0) -> None:
    """Return once the cluster can coordinate consumer groups.

    A fresh broker creates ``__consumer_offsets`` on the first FindCoordinator request and answers
    COORDINATOR_NOT_AVAILABLE until it is ready; asked here first, the services' consumers join at once
    instead of logging that error while they retry.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(within_s * 1000))
    await admin.start()
    try:
        deadline = time.monotonic() + within_s
        while True:
            try:
                await admin.find_coordinator("agentstream-readiness")
                return
            except CoordinatorNotAvailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: Iterable[str], *, timeout_ms: int = 30000) -> None:
    """Delete topics (those that do not exist are ignored), so a long-lived development broker does not
    pile up the thousands that tests and benchmarks create."""
    names = list(names)
    if not names:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [n for n in names if n in existing]
        if doomed:
            await admin.delete_topics(doomed, timeout_ms=timeout_ms)
    finally:
        await admin.close()
