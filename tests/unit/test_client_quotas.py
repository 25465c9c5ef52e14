"""Kafka client quotas on tenants' principals (agentstream/ops/client_quotas.py): the settings, the
``kafka-configs.sh`` arguments ``deploy render`` uses, and the AlterClientQuotas request's encoding. Applying
them to a broker is tried in tests/integration/hostile/test_tenant_flood.py."""

from __future__ import annotations

import struct

import pytest

from agentstream.ops.client_quotas import (
    DEFAULT_PRODUCER_BYTE_RATE,
    TenantKafkaQuota,
    _AlterClientQuotas,
    _AlterClientQuotasRequestV0,
    kafka_configs_args,
    tenant_quotas,
)
from agentstream.streams.core.errors import ConfigError


def test_the_quota_comes_from_the_environment_with_a_default_rate():
    assert TenantKafkaQuota.load({}) == TenantKafkaQuota(producer_byte_rate=DEFAULT_PRODUCER_BYTE_RATE)
    assert TenantKafkaQuota.load({"AGENTSTREAM_TENANT_PRODUCER_BYTE_RATE": "65536",
                                  "AGENTSTREAM_TENANT_REQUEST_PERCENTAGE": "25"}) == TenantKafkaQuota(65536, 25.0)
    assert TenantKafkaQuota.load({"AGENTSTREAM_TENANT_PRODUCER_BYTE_RATE": "0"}) == TenantKafkaQuota(None, None)
    with pytest.raises(ConfigError, match="AGENTSTREAM_TENANT_PRODUCER_BYTE_RATE"):
        TenantKafkaQuota.load({"AGENTSTREAM_TENANT_PRODUCER_BYTE_RATE": "fast"})
    with pytest.raises(ConfigError, match="AGENTSTREAM_TENANT_REQUEST_PERCENTAGE"):
        TenantKafkaQuota.load({"AGENTSTREAM_TENANT_REQUEST_PERCENTAGE": "-1"})


def test_kafka_configs_arguments_set_what_is_set_and_delete_nothing():
    """kafka-configs 4.0 refuses to delete an entry the broker lacks, which would fail a first setup."""
    args = kafka_configs_args("acme", TenantKafkaQuota(1048576), bootstrap="kafka:9092",
                              command_config="/etc/kafka/admin.properties")
    assert args == ["--bootstrap-server", "kafka:9092", "--command-config", "/etc/kafka/admin.properties", "--alter",
                    "--entity-type", "users", "--entity-name", "tenant-acme",
                    "--add-config", "producer_byte_rate=1048576"]
    named = kafka_configs_args("acme", TenantKafkaQuota(1), bootstrap="k:9092", principal="cell-acme")
    assert named[named.index("--entity-name") + 1] == "cell-acme"
    both = kafka_configs_args("beta", TenantKafkaQuota(2048, 12.5), bootstrap="k:9092")
    assert both[-2:] == ["--add-config", "producer_byte_rate=2048,request_percentage=12.5"]
    assert "--command-config" not in both


def test_the_alter_request_names_each_principal_and_removes_unset_entries():
    request = _AlterClientQuotas(tenant_quotas(("acme",), TenantKafkaQuota(4096))).build(_AlterClientQuotasRequestV0)
    (entity, ops), = request.entries
    assert entity == [("user", "tenant-acme")]
    assert ops == [("producer_byte_rate", 4096.0, False), ("request_percentage", 0.0, True)]
    wire = request.encode()
    assert wire.startswith(struct.pack(">i", 1)) and b"tenant-acme" in wire and wire.endswith(b"\x00")
    assert struct.pack(">d", 4096.0) in wire
