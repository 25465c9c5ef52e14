"""Kafka with authentication and ACLs (``agentstream dev up --secure``), tried as a hostile client would.

A private broker with SASL/SCRAM and the StandardAuthorizer (``PrivateStack(secure=True)``), the ACLs
``streams/acls.py`` derives from the topic contract, and workers as separate processes, each
authenticating as its own service with its password given by file: an unauthenticated client and a
wrong password are refused; the client principal cannot publish a tool request (nor read one), and no
principal can write or read more than its ACLs say; a run still completes end to end; a forged tool call
published with a worker's own principal is still refused by the tool service; and no password shows in
any log or CLI output.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from agentstream.devstack.private import PrivateStack
from agentstream.streams.acls import PRINCIPALS, Operation, Resource, acl_bindings
from agentstream.streams.client import AgentClient
from agentstream.streams.codec import codec_for
from agentstream.streams.events import DeadLetter, ToolCallRequested, new_run_id
from agentstream.streams.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.tool_catalog import ToolCatalog
from agentstream.streams.topics import Topics
from agentstream.testing import end_offsets, read_events
from tests.integration.processes import ROOT, start_worker, stop, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")
PREFIX = "sec."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[PrivateStack]:
    private = PrivateStack(tmp_path_factory.mktemp("secure") / "state", secure=True)
    await private.start()
    try:
        await private.grant(Topics(PREFIX, partitions=4))
        yield private
    finally:
        await private.close()


def _producer(stack: PrivateStack, auth: KafkaAuth) -> AIOKafkaProducer:
    return AIOKafkaProducer(**kafka_options(stack.bootstrap, auth), acks="all", request_timeout_ms=5000)


async def test_an_unauthenticated_client_and_a_wrong_password_are_refused(stack):
    for auth in (KafkaAuth(), KafkaAuth(security_protocol="SASL_PLAINTEXT", username="client", password="guess")):
        producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, auth), request_timeout_ms=3000,
                                    metadata_max_age_ms=3000)
        with pytest.raises(KafkaError):
            await producer.start()  # no metadata without authenticating: nothing can be sent
        await producer.stop()


async def _can_write(stack: PrivateStack, principal: str, topic: str) -> bool:
    producer = _producer(stack, stack.auth(principal))
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"not an event", key=b"acl-check")
        return True
    except TopicAuthorizationFailedError:
        return False
    finally:
        await producer.stop()


async def _can_read(stack: PrivateStack, principal: str, topic: str) -> bool:
    """Whether ``principal`` gets a record the administrator just wrote (an unauthorized fetch returns
    nothing: aiokafka logs the refusal and keeps trying)."""
    producer = _producer(stack, stack.auth("admin"))
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"marker", key=b"acl-check", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**kafka_options(stack.bootstrap, stack.auth(principal)), enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=5000)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        for _ in range(6):
            try:
                if any((await consumer.getmany(timeout_ms=500)).values()):
                    return True
            except TopicAuthorizationFailedError:
                return False
        return False
    finally:
        await consumer.stop()


async def test_the_client_cannot_publish_or_read_tool_requests(stack):
    topics = Topics("acl1.", partitions=1)
    await stack.grant(topics)
    assert not await _can_write(stack, "client", topics.tool_requests)
    assert not await _can_read(stack, "client", topics.tool_requests)
    assert not await _can_write(stack, "client", topics.tool_results)
    assert await _can_write(stack, "client", topics.tasks)
    assert await _can_read(stack, "client", topics.outcomes)
    # the tool service: reads tool requests, writes tool results — and cannot ask the model or plan
    assert await _can_read(stack, "tools", topics.tool_requests)
    assert await _can_write(stack, "tools", topics.tool_results)
    assert not await _can_write(stack, "tools", topics.inference_requests)
    assert not await _can_write(stack, "tools", topics.tasks)
    assert not await _can_read(stack, "tools", topics.outcomes)


async def test_every_principal_writes_exactly_the_topics_its_acls_name(stack):
    topics = Topics("acl2.", partitions=1)
    await stack.grant(topics)
    bindings = acl_bindings(topics)
    names = [s.name for s in topics.specs()]
    for principal in PRINCIPALS:
        allowed = {b.name for b in bindings if b.principal == principal and b.resource is Resource.TOPIC
                   and b.operation in (Operation.WRITE, Operation.ALL)
                   and b.pattern.name == "LITERAL"}
        for topic in names:
            assert await _can_write(stack, principal, topic) == (topic in allowed), (principal, topic)


def _passwords(stack: PrivateStack) -> list[str]:
    assert stack.secrets is not None
    return [stack.secrets.password(p) for p in ("admin", *PRINCIPALS)]


async def test_a_run_completes_with_each_service_as_its_own_principal(stack, tmp_path):
    settings = stack.settings(topic_prefix=PREFIX, principal="client")
    logs = []
    procs = []
    for service in ("planner", "planner", "inference", "tools", "retrieval"):
        log = tmp_path / f"{service}-{len(procs)}.log"
        logs.append(log)
        procs.append(start_worker(settings, service, log, **stack.env(service)))
    try:
        async with AgentClient(settings) as client:
            catalog = ToolCatalog.for_runtime(client.runtime, ttl_s=0.0)
            try:  # the tool worker has registered its tools (a task's default tools are those registered)
                await wait_for(lambda: _has(catalog, "calculator"), 90, "the calculator's registration")
            finally:
                await catalog.close()
            run_id = await client.submit("What is 17 * 23? Use the calculator.", prefetch=False)
            result = await client.wait(run_id, timeout=120)
            assert result.ok and "391" in (result.answer or ""), result

            # A worker's principal may publish tool requests (the planner's does); the tool service still
            # checks each against its run: a call for a run that does not exist runs nothing.
            forged = ToolCallRequested.build(run_id=(ghost := new_run_id()), step=f"{ghost}:1:tool",
                                             service="attacker", tool="calculator",
                                             arguments=json.dumps({"expression": "1+1"}))
            topics = Topics.of(settings)
            producer = _producer(stack, stack.auth("planner"))
            await producer.start()
            try:
                meta = await producer.send_and_wait(topics.tool_requests, codec_for(settings).encode(forged),
                                                    key=ghost.encode(), partition=topics.partition_for(ghost))
            finally:
                await producer.stop()
            letter = await _dead_letter(stack, topics, (meta.partition, meta.offset))
            assert (letter.error_kind, letter.consumer) == ("refused", "tools"), letter
    finally:
        for proc in procs:
            stop(proc)
    cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentstream.cli", "dev", "status", "--json"], cwd=ROOT,
                         env={**os.environ, **stack.env("client")}, capture_output=True, text=True, timeout=60)
    text = "\n".join(log.read_text() for log in logs) + cli.stdout + cli.stderr
    assert "Authenticated as planner" in text  # the logs are the workers' own, on the secure broker
    for password in _passwords(stack):
        assert password not in text


async def _has(catalog: ToolCatalog, tool: str) -> bool:
    return tool in await catalog.refresh()


async def _dead_letter(stack: PrivateStack, topics: Topics, source: tuple[int, int]) -> DeadLetter:
    settings = stack.settings(topic_prefix=PREFIX, principal="operator")
    dlq = TopicPartition(topics.dlq, 0)
    for _ in range(100):
        end = (await end_offsets(settings, [dlq]))[dlq]
        for letter in await read_events(settings, dlq, 0, expect=end, timeout=5) if end else []:
            if (isinstance(letter, DeadLetter) and letter.source_topic == topics.tool_requests
                    and (letter.source_partition, letter.source_offset) == source):
                return letter
        await asyncio.sleep(0.2)
    raise AssertionError(f"no dead letter for the tool request at {source}")
