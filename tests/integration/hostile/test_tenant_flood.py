"""A tenant's producer flooding one partition (issue 36, "Bad input"): the broker throttles it at its
principal's quota (``PrivateStack`` sets each tenant's, as ``agentstream dev up --secure --tenant`` does:
agentstream/ops/client_quotas.py), and the other tenant's run, submitted during the flood, completes.
The p99 of the other tenant's runs with and without a flood is ``bench/perf/tenant_flood.py``'s."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient

from agentstream.ops.acls import ADMIN, tenant_principal
from agentstream.ops.client_quotas import DEFAULT_PRODUCER_BYTE_RATE, described_quota
from agentstream.streams.config.kafka_auth import kafka_options
from tests.integration.hostile.conftest import ACME, BETA, BETA_PRODUCE_RATE

pytestmark = pytest.mark.asyncio(loop_scope="package")

RECORD = b"\xff" * 16384  # junk: beta's planner dead-letters it (undecodable)
#: The most the flood writes: ten times the burst the broker lets through (10 s worth of the rate).
CAP = 100 * BETA_PRODUCE_RATE


async def test_every_tenants_principal_has_its_produce_quota_on_the_broker(cells):
    admin = AIOKafkaClient(**kafka_options(cells.stack.bootstrap, cells.stack.auth(ADMIN)))
    await admin.bootstrap()
    try:
        node = int(next(iter(admin.cluster.brokers())).nodeId)
        assert await described_quota(admin, node, tenant_principal(BETA)) == {"producer_byte_rate": BETA_PRODUCE_RATE}
        assert await described_quota(admin, node, tenant_principal(ACME)) == \
            {"producer_byte_rate": DEFAULT_PRODUCER_BYTE_RATE}  # as `dev up` sets it
        assert await described_quota(admin, node, "planner") == {}  # services are not limited
    finally:
        await admin.close()


async def test_a_tenant_flooding_a_partition_is_throttled_and_the_other_tenants_run_completes(cells):
    flooder = AIOKafkaProducer(**kafka_options(cells.stack.bootstrap, cells.stack.auth(tenant_principal(BETA))),
                               acks="all", max_batch_size=4 * len(RECORD), linger_ms=5)
    await flooder.start()
    throttles: list[int] = []
    send = flooder.client.send

    async def noting_throttles(node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
        """The broker's answer to each produce request says how long it held the producer back."""
        response = await send(node_id, request, *args, **kwargs)
        if type(response).__name__.startswith("ProduceResponse"):
            throttles.append(response.throttle_time_ms)
        return response

    flooder.client.send = noting_throttles  # type: ignore[method-assign]
    written = 0
    async with cells.client(ACME) as acme:
        other = await acme.submit("What is 2 * 3?", tools=["calculator"], max_steps=4, prefetch=False)
        started = time.monotonic()
        try:
            pending = []
            while written < CAP and not any(throttles):
                pending.append(await flooder.send(cells.topics(BETA).tasks, RECORD, partition=0))
                written += len(RECORD)
            await asyncio.gather(*pending)
        finally:
            await flooder.stop()
        elapsed = time.monotonic() - started
        assert any(throttles), f"{written:,} bytes in {elapsed:.2f} s and the broker never throttled the flood"
        assert (await acme.wait(other, timeout=60)).ok
    # The broker holds beta's principal back for this long: let it pass before the package's next tests.
    await asyncio.sleep(max(throttles) / 1000)
