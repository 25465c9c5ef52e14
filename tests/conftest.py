"""Session fixtures for the real Kafka broker and PostgreSQL server every integration test uses.

Where they come from, first match wins:

1. ``KAFKA_BOOTSTRAP_SERVERS`` / ``DATABASE_URL`` in the environment (your own cluster);
2. testcontainers, when a Docker engine answers (``apache/kafka`` and ``pgvector/pgvector`` images);
3. the project's local launcher (``agentstream dev up``): reused when already running, else started
   here and stopped at the end of the session.

Isolation: each test gets topic names under a unique prefix (and deletes them after), and the session
gets a fresh database (migrations applied) that is dropped at the end.
"""

from __future__ import annotations

import asyncio
import os
import string
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from agentstream.devstack.kafka import wait_for_metadata
from agentstream.devstack.process import free_port
from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.config.stack_state import StackPaths
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import TopicSpec
from agentstream.streams.store import migrations

KAFKA_IMAGE = "apache/kafka:4.0.2"
POSTGRES_IMAGE = "pgvector/pgvector:pg18"


@dataclass(frozen=True)
class Infra:
    kafka: str
    server_url: str  # a PostgreSQL URL whose database may be used to CREATE/DROP DATABASE
    origin: str  # "env", "testcontainers" or "local"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def _broker_env_from_template(port: int) -> dict[str, str]:
    """The apache/kafka image reads KAFKA_X_Y as x.y: reuse our broker settings, minus networking."""
    skip = ("listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs",
            "listener.security.protocol.map", "controller.listener.names", "inter.broker.listener.name")
    env = {}
    template = string.Template((StackPaths.from_env().infra_dir / "kafka" / "server.properties.in").read_text()
                               ).safe_substitute(node_id="1", replication="1", min_isr="1")
    for line in template.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        if key in skip:
            continue
        env["KAFKA_" + key.upper().replace(".", "_")] = value
    env.update({
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
    })
    return env


@pytest.fixture(scope="session")
def infra() -> Iterator[Infra]:
    env_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    env_db = os.environ.get("DATABASE_URL")
    if env_kafka and env_db:
        yield Infra(env_kafka, env_db, "env")
        return
    if _docker_answers():
        from testcontainers.core.container import DockerContainer
        from testcontainers.postgres import PostgresContainer

        port = free_port()
        kafka = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port)
        for key, value in _broker_env_from_template(port).items():
            kafka = kafka.with_env(key, value)
        pg = PostgresContainer(POSTGRES_IMAGE, username="postgres", password="postgres", dbname="postgres")
        with kafka, pg:
            bootstrap = f"127.0.0.1:{port}"
            asyncio.run(wait_for_metadata(bootstrap, within=90, auth=KafkaAuth()))
            yield Infra(env_kafka or bootstrap, env_db or pg.get_connection_url(driver=None), "testcontainers")
        return
    from agentstream.devstack.stack import DevStack

    stack = DevStack()
    was_running = stack.status().running
    status = stack.up()
    try:
        yield Infra(env_kafka or status.kafka, env_db or status.database_url, "local")
    finally:
        if not was_running:
            stack.down()


@pytest.fixture(scope="session")
def kafka_bootstrap(infra: Infra) -> str:
    return infra.kafka


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


@pytest.fixture(scope="session")
def database_url(infra: Infra) -> Iterator[str]:
    """A fresh database for this test session, migrated; dropped afterwards."""
    name = f"agentstream_test_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(infra.server_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = _with_database(infra.server_url, name)
    asyncio.run(migrations.migrate(url))
    try:
        yield url
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def unique() -> str:
    """A short random token for names that must not collide across tests or runs."""
    return uuid.uuid4().hex[:10]


TopicFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def topic_factory(kafka_bootstrap: str, unique: str) -> AsyncIterator[TopicFactory]:
    """Create uniquely named topics for one test; delete them when it ends."""
    from aiokafka.admin import AIOKafkaAdminClient

    created: list[str] = []

    async def create(name: str, *, partitions: int = 1, configs: dict[str, str] | None = None) -> str:
        full = f"test.{unique}.{name}"
        await ensure_topics(kafka_bootstrap, [TopicSpec(full, partitions, 1, configs or {})], auth=KafkaAuth())
        created.append(full)
        return full

    yield create
    if created:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(created)
        finally:
            await admin.close()


@pytest.fixture(scope="session")
def settings(infra: Infra, database_url: str):
    """Settings for the session's broker and database (tests give each pipeline its own prefix)."""
    from agentstream.streams.config.settings import Settings

    return Settings(kafka_bootstrap=infra.kafka, database_url=database_url, partitions=4,
                    session_timeout_ms=6000)


@pytest.fixture(scope="session")
def effects_table(database_url: str) -> str:
    """The table tests/integration/pipeline_tools.py's ``effect`` tool writes to."""

    from tests.integration.pipeline_tools import EFFECTS_TABLE

    async def create() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(EFFECTS_TABLE)
        finally:
            await conn.close()

    asyncio.run(create())
    return "test_effects"
