"""Kafka client quotas on tenants' principals: how fast a tenant's producers may write (issue 36, item 4).

A tenant's principal (``tenant-<name>``, agentstream/ops/acls.py) writes its cell's intake; nothing stops one
of its producers from flooding a partition as fast as the broker takes records, which costs the broker's
disk and network threads and every consumer of that topic time, other tenants' included. A user quota
(``producer_byte_rate``, bytes per second per broker, summed over all the principal's connections; and
optionally ``request_percentage``, the share of the broker's request threads' time) makes the broker delay
its responses, and mute a client that does not wait, until the principal is back under the rate: the
flooder is slowed, the others are not. The broker measures the rate over ``quota.window.num`` (11) windows
of ``quota.window.size.seconds`` (1 s), so a burst of about ten seconds' worth of the rate goes through
before the first delay.

Set by ``agentstream dev up --secure --tenant …`` and ``PrivateStack`` (``apply_client_quotas``: the raw
AlterClientQuotas request, aiokafka having no call for it, as ``apply_acls`` does for ACLs); for another
cluster, ``kafka_configs_args`` gives the same as ``kafka-configs.sh`` arguments (``deploy render``).
Service principals get none: a quota on them would slow every cell's real work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DescribeClientQuotasRequest
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Float64, Int16, Int32, Schema, String

from agentstream.ops.acls import tenant_principal
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.errors import ConfigError

#: Bytes per second a tenant's producers may write to each broker (1 MiB/s: thousands of tasks a second).
DEFAULT_PRODUCER_BYTE_RATE = 1_048_576
PRODUCER_BYTE_RATE_ENV = "AGENTSTREAM_TENANT_PRODUCER_BYTE_RATE"
REQUEST_PERCENTAGE_ENV = "AGENTSTREAM_TENANT_REQUEST_PERCENTAGE"


@dataclass(frozen=True)
class TenantKafkaQuota:
    """What each tenant's principal may use of a broker; None: no limit (a quota set before is removed)."""

    producer_byte_rate: int | None = DEFAULT_PRODUCER_BYTE_RATE
    #: Percent of one request-handler thread's time per quota window (100: one whole thread).
    request_percentage: float | None = None

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> TenantKafkaQuota:
        """``AGENTSTREAM_TENANT_PRODUCER_BYTE_RATE`` (bytes/s, default 1048576; 0: none) and
        ``AGENTSTREAM_TENANT_REQUEST_PERCENTAGE`` (default none; 0: none)."""
        import os

        env = os.environ if environ is None else environ
        rate = _number(env, PRODUCER_BYTE_RATE_ENV, float(DEFAULT_PRODUCER_BYTE_RATE))
        share = _number(env, REQUEST_PERCENTAGE_ENV, 0.0)
        return cls(producer_byte_rate=int(rate) or None, request_percentage=share or None)

    def configs(self) -> dict[str, float | None]:
        """The quota's entries by Kafka's names (None: remove the entry)."""
        return {"producer_byte_rate": None if self.producer_byte_rate is None else float(self.producer_byte_rate),
                "request_percentage": self.request_percentage}


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0 or value != value:
        raise ConfigError(f"{name} must be a number of 0 or more (0: no quota), not {raw!r}")
    return value


def kafka_configs_args(tenant: str, quota: TenantKafkaQuota, *, bootstrap: str, command_config: str | None = None,
                       principal: str | None = None) -> list[str]:
    """The arguments of ``kafka-configs.sh`` (``kafka.admin.ConfigCommand``) that set ``quota`` on
    ``tenant``'s principal (``principal``: a cell that names its own) at ``bootstrap``, as the cluster's
    administrator (``command_config``: a client properties file with its SASL settings): ``--add-config``
    for the entries set, and nothing for the others. (kafka-configs 4.0 refuses ``--delete-config`` of an
    entry the broker does not have, "Invalid config(s)", which would fail every first setup; an entry set
    before and now left out is removed by hand: docs/deploy.md; ``apply_client_quotas``, which ``dev up``
    uses, removes it over the protocol.)"""
    added = [f"{key}={_shown(value)}" for key, value in quota.configs().items() if value is not None]
    args = ["--bootstrap-server", bootstrap, *(["--command-config", command_config] if command_config else []),
            "--alter", "--entity-type", "users", "--entity-name", principal or tenant_principal(tenant)]
    return args + (["--add-config", ",".join(added)] if added else [])


def _shown(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


class _AlterClientQuotasResponse(Response):
    API_KEY = 49
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("entries", Array(("error_code", Int16), ("error_message", String("utf-8")),
                          ("entity", Array(("entity_type", String("utf-8")), ("entity_name", String("utf-8")))))),
    )


class _AlterClientQuotasRequestV0(RequestStruct):
    API_KEY = 49
    API_VERSION = 0
    RESPONSE_TYPE = _AlterClientQuotasResponse
    SCHEMA = Schema(
        ("entries", Array(("entity", Array(("entity_type", String("utf-8")), ("entity_name", String("utf-8")))),
                          ("ops", Array(("key", String("utf-8")), ("value", Float64), ("remove", Boolean))))),
        ("validate_only", Boolean),
    )


class _AlterClientQuotas(Request[_AlterClientQuotasRequestV0]):
    """AlterClientQuotas v0 (Kafka 2.6+): user quotas, one entry per principal."""

    API_KEY = 49

    def __init__(self, quotas: Mapping[str, TenantKafkaQuota]) -> None:
        self.quotas = quotas

    def build(self, request_struct_class: type[_AlterClientQuotasRequestV0]) -> _AlterClientQuotasRequestV0:
        entries = [([("user", principal)], [(key, value or 0.0, value is None) for key, value in q.configs().items()])
                   for principal, q in self.quotas.items()]
        return request_struct_class(entries, False)


async def apply_client_quotas(bootstrap: str, admin: KafkaAuth, quotas: Mapping[str, TenantKafkaQuota], *,
                              within_s: float = 30.0) -> None:
    """Set ``quotas`` (by principal) as ``admin`` (a super user) and wait until every broker reports them
    (each learns them from the metadata log, a moment after the controller accepted them)."""
    if not quotas:
        return
    client = AIOKafkaClient(**kafka_options(bootstrap, admin))
    await client.bootstrap()
    try:
        response = await client.send(client.get_random_node(), _AlterClientQuotas(quotas))
        for code, message, entity in response.entries:
            if code:
                raise for_code(code)(f"setting the client quota of {entity}: {message}")
        deadline = time.monotonic() + within_s
        for broker in client.cluster.brokers():
            for principal, quota in quotas.items():
                wanted = {k: v for k, v in quota.configs().items() if v is not None}
                while await described_quota(client, int(broker.nodeId), principal) != wanted:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"broker {broker.nodeId} did not report {principal}'s quota within "
                                           f"{within_s:.0f} s")
                    await asyncio.sleep(0.05)
    finally:
        await client.close()


async def described_quota(client: AIOKafkaClient, node: int, principal: str) -> dict[str, float]:
    """The user quota broker ``node`` applies to ``principal`` (its entries by Kafka's names)."""
    response = await client.send(node, DescribeClientQuotasRequest([("user", 0, principal)], True))
    if response.error_code:
        raise for_code(response.error_code)(f"describing {principal}'s quota: {response.error_message}")
    return {key: value for _entity, values in response.entries for key, value in values}


def tenant_quotas(tenants: tuple[str, ...], quota: TenantKafkaQuota) -> dict[str, TenantKafkaQuota]:
    """``quota`` for each tenant's principal."""
    return {tenant_principal(t): quota for t in tenants}


__all__ = ["DEFAULT_PRODUCER_BYTE_RATE", "TenantKafkaQuota", "apply_client_quotas", "described_quota",
           "kafka_configs_args", "tenant_quotas"]
