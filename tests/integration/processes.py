"""Workers as separate processes (``agentstream worker …``), for tests that kill, pause and scale them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from agentstream.devstack.private import PrivateStack
from agentstream.streams.config.settings import Settings
from tests.integration.pipeline_tools import EFFECTS_TABLE

ROOT = Path(__file__).resolve().parents[2]


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that points a worker process at the test's broker, database and topics."""
    return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
            "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions),
            "AGENTSTREAM_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
            "AGENTSTREAM_REPLICATION_FACTOR": str(settings.replication_factor), **extra}


def start_worker(settings: Settings, service: str, log: Path, *args: str, **env: str) -> subprocess.Popen:
    """``agentstream worker SERVICE ARGS…`` with its output appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", service, *args],
                                env=worker_env(settings, **env), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Signal the process and wait for it (SIGKILL after ``timeout``)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def group_members(bootstrap: str, group: str) -> int:
    """Members of a consumer group that hold partitions now (a stable group, not one rebalancing)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (description,) = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    _error, _group, state, _protocol_type, _protocol, members, *_ = description.groups[0]
    return len(members) if state == "Stable" else -1


async def wait_for_members(bootstrap: str, group: str, count: int, timeout: float = 90.0) -> None:
    async def ready() -> bool:
        return await group_members(bootstrap, group) == count

    await wait_for(ready, timeout, f"{count} stable members in {group}")


@asynccontextmanager
async def private_stack(directory: Path) -> AsyncIterator[PrivateStack]:
    """A broker and a database of the test module's own (to stop, kill and restart), with the effects table."""
    private = PrivateStack(directory)
    await private.start()
    try:
        conn = await asyncpg.connect(private.database_url)
        try:
            await conn.execute(EFFECTS_TABLE)
        finally:
            await conn.close()
        yield private
    finally:
        await private.close()
