"""agentstream on a broker with Kafka's defaults (``auto.create.topics.enable=true``): no client creates a
topic by asking for it, a topic someone else created is repaired or refused, and the pipeline works.

The module starts its own broker (the shared one has auto-creation off) on free ports, data under a
temporary directory; the database is the session's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.protocol.metadata import MetadataRequest

from agentstream.devstack.kafka import KafkaLauncher
from agentstream.devstack.process import free_port
from agentstream.services.worker import WorkerOptions
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import StackPaths
from agentstream.streams.core.errors import StackError, TopicMismatch, TopicsMissing
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import Pipeline

AUTO_CREATE = {"auto.create.topics.enable": "true", "num.partitions": "1"}  # Kafka's defaults


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    paths = StackPaths.from_env()
    launcher = KafkaLauncher(infra_dir=paths.infra_dir, cache_dir=paths.cache_dir,
                             work_dir=tmp_path_factory.mktemp("kafka-auto-create"), port=free_port(),
                             controller_port=free_port(), overrides=AUTO_CREATE)
    try:
        launcher.preflight()
    except StackError as exc:  # no Java, or no jars and no Maven to fetch them
        pytest.skip(f"cannot run a second Kafka broker here: {exc}")
    ref = launcher.start(timeout=120)
    try:
        yield launcher.bootstrap
    finally:
        KafkaLauncher.stop(ref)


def on(settings: Settings, broker: str, prefix: str) -> Settings:
    return replace(settings, kafka_bootstrap=broker, topic_prefix=prefix)


async def list_topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await admin.list_topics()
    finally:
        await admin.close()


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int:
    (description,) = await admin.describe_topics([topic])
    return len(description["partitions"])


async def topic_config(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    ((_code, _msg, _type, _name, entries),) = response.resources
    return {entry[0]: entry[1] for entry in entries}


async def ask_for_metadata(bootstrap: str, topic: str, *, allow_auto_topic_creation: bool | None) -> None:
    """A metadata request for one topic, as aiokafka's clients send it (``None``: their default)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        node = client.get_random_node()
        await client.send(node, MetadataRequest([topic], allow_auto_topic_creation=allow_auto_topic_creation))
    finally:
        await client.close()


async def test_a_client_started_before_any_worker_says_which_topics_are_missing(broker, settings, unique):
    s = on(settings, broker, f"a{unique}.")
    topics = Topics(s.topic_prefix, s.partitions)
    control = f"control{unique}"
    try:
        # The broker does create topics on request: the checks below could fail.
        await ask_for_metadata(broker, control, allow_auto_topic_creation=True)
        client = AgentClient(s)
        with pytest.raises(TopicsMissing) as refused:
            await client.start()
        await client.close()
        await ask_for_metadata(broker, topics.outcomes, allow_auto_topic_creation=None)
        producer = AIOKafkaProducer(bootstrap_servers=broker, request_timeout_ms=1500)
        await producer.start()
        try:
            with pytest.raises(UnknownTopicOrPartitionError):  # it waited and the topic never came
                await producer.partitions_for(topics.tasks)
        finally:
            await producer.stop()

        message = str(refused.value)
        assert all(name in message for name in (topics.tasks, topics.outcomes, topics.tokens, topics.tools)), message
        assert "agentstream worker all" in message and "agentstream dev up" in message
        on_broker = await list_topics(broker)
        assert control in on_broker
        assert [t for t in on_broker if t.startswith(s.topic_prefix)] == []
    finally:
        await topics.delete_all(broker, auth=KafkaAuth())
        admin = AIOKafkaAdminClient(bootstrap_servers=broker)
        await admin.start()
        try:
            await admin.delete_topics([control])
        finally:
            await admin.close()


async def test_a_wrong_cleanup_policy_and_an_empty_short_topic_are_repaired(broker, settings, unique, caplog):
    s = on(settings, broker, f"b{unique}.")
    topics = Topics(s.topic_prefix, s.partitions)
    specs = topics.specs()
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topics.runs, s.partitions, 1, topic_configs={
            "cleanup.policy": "delete", "max.message.bytes": "123456"})])
        # What a client of another tool does on this broker: agent.outcomes appears with 1 partition.
        await ask_for_metadata(broker, topics.outcomes, allow_auto_topic_creation=True)
        assert await _settled_partition_count(admin, topics.outcomes) == 1

        with caplog.at_level(logging.WARNING, logger="agentstream.streams.kafka.topics"):
            created = await ensure_topics(broker, specs, auth=KafkaAuth())
        assert sorted(created) == sorted(spec.name for spec in specs if spec.name not in
                                         (topics.runs, topics.outcomes))
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(topics.runs in w and "cleanup.policy delete → compact" in w for w in warnings), warnings
        assert any(topics.outcomes in w and "added partitions" in w for w in warnings), warnings

        runs = await topic_config(admin, topics.runs)
        wanted = next(spec for spec in specs if spec.name == topics.runs).configs
        assert {k: runs[k] for k in wanted} == dict(wanted)
        assert runs["max.message.bytes"] == "123456"  # set on the topic outside the catalogue: kept
        assert await partition_count(admin, topics.outcomes) == s.partitions
        outcomes = await topic_config(admin, topics.outcomes)
        assert outcomes["cleanup.policy"] == "delete" and outcomes["retention.ms"] == str(7 * 24 * 3600 * 1000)

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentstream.streams.kafka.topics"):
            assert await ensure_topics(broker, specs, auth=KafkaAuth()) == []
        assert [r for r in caplog.records if r.levelno == logging.WARNING] == []  # nothing left to repair
    finally:
        await admin.close()
        await topics.delete_all(broker, auth=KafkaAuth())


async def _settled_partition_count(admin: AIOKafkaAdminClient, topic: str, within_s: float = 10.0) -> int:
    """An auto-created topic is described without partitions until its leader is elected."""
    for _ in range(int(within_s * 10)):
        (description,) = await admin.describe_topics([topic])
        if not description["error_code"] and description["partitions"]:
            return len(description["partitions"])
        await asyncio.sleep(0.1)
    raise AssertionError(f"topic {topic} has no partitions after {within_s} s")


async def test_a_topic_whose_partitions_cannot_change_is_refused(broker, settings, unique):
    s = on(settings, broker, f"c{unique}.")
    topics = Topics(s.topic_prefix, s.partitions)
    by_name = {spec.name: spec for spec in topics.specs()}
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topics.outcomes, 1, 1), NewTopic(topics.dlq, 3, 1)])
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        try:
            await producer.send_and_wait(topics.outcomes, b"an outcome", key=b"run-1")
        finally:
            await producer.stop()

        with pytest.raises(TopicMismatch) as short:
            await ensure_topics(broker, [by_name[topics.outcomes]], auth=KafkaAuth())
        assert f"topic {topics.outcomes} has 1 partitions, the catalogue says {s.partitions}" in str(short.value)
        assert "already holds records" in str(short.value) and "Delete the topic" in str(short.value)
        assert await partition_count(admin, topics.outcomes) == 1  # left as it was

        with pytest.raises(TopicMismatch) as extra:
            await ensure_topics(broker, [by_name[topics.dlq]], auth=KafkaAuth())
        assert f"topic {topics.dlq} has 3 partitions, the catalogue says 1" in str(extra.value)
        assert "cannot remove partitions" in str(extra.value) and "delete the topic" in str(extra.value)
    finally:
        await admin.close()
        await topics.delete_all(broker, auth=KafkaAuth())


async def test_the_pipeline_runs_and_creates_only_the_catalogues_topics(broker, settings, unique):
    s = on(settings, broker, f"d{unique}.")
    catalogue = {spec.name for spec in Topics(s.topic_prefix, s.partitions).specs()}
    before = set(await list_topics(broker))
    async with Pipeline.start(s, WorkerOptions(backend="scripted")) as pipe:
        run_ids = [await pipe.client.submit(f"What is 2 + {i}?", tools=["calculator"]) for i in (3, 4, 5)]
        results = [await pipe.client.wait(run_id, timeout=60) for run_id in run_ids]
        during = await list_topics(broker)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker)
        await admin.start()
        try:
            outcome_partitions = await partition_count(admin, pipe.client.topics.outcomes)
        finally:
            await admin.close()

    assert [r.status for r in results] == ["completed"] * 3, results
    assert [(r.answer or "").rsplit(" ", 1)[-1] for r in results] == ["5", "6", "7"], results
    assert [r.steps for r in results] == [3, 3, 3], results  # model → calculator → model
    assert {t for t in during if t.startswith(s.topic_prefix)} == catalogue
    assert [t for t in set(during) - before - catalogue if not t.startswith("__")] == []
    assert outcome_partitions == s.partitions
