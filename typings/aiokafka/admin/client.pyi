from ssl import SSLContext
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin.config_resource import ConfigResource
from aiokafka.admin.new_partitions import NewPartitions
from aiokafka.admin.new_topic import NewTopic
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.protocol.api import Response
from aiokafka.structs import OffsetAndMetadata, TopicPartition

# aiokafka returns the negotiated version of each response class; these name the fields (from the
# protocol schemas in aiokafka/protocol/admin.py) that every version accepted here has. Nullable
# strings decode to None.

class _CreateTopicsResponse(Response):
    # v0: (topic, error_code); v1 and later: (topic, error_code, error_message)
    topic_errors: list[tuple[str, int] | tuple[str, int, str | None]]

class _DeleteTopicsResponse(Response):
    topic_error_codes: list[tuple[str, int]]

class _CreatePartitionsResponse(Response):
    topic_errors: list[tuple[str, int, str | None]]

# v0: (name, value, read_only, is_default, is_sensitive);
# v1 and later: (name, value, read_only, config_source, is_sensitive, synonyms)
_ConfigEntry = (
    tuple[str, str | None, bool, int, bool]
    | tuple[str, str | None, bool, int, bool, list[tuple[str, str | None, int]]]
)

class _DescribeConfigsResponse(Response):
    # (error_code, error_message, resource_type, resource_name, config_entries)
    resources: list[tuple[int, str | None, int, str, list[_ConfigEntry]]]

class _AlterConfigsResponse(Response):
    # (error_code, error_message, resource_type, resource_name)
    resources: list[tuple[int, str | None, int, str]]

class AIOKafkaAdminClient:
    def __init__(
        self,
        *,
        bootstrap_servers: str | list[str] = ...,
        client_id: str = ...,
        request_timeout_ms: int = ...,
        connections_max_idle_ms: int = ...,
        retry_backoff_ms: int = ...,
        metadata_max_age_ms: int = ...,
        security_protocol: str = ...,
        ssl_context: SSLContext | None = ...,
        sasl_mechanism: str = ...,
        sasl_plain_username: str | None = ...,
        sasl_plain_password: str | None = ...,
        sasl_kerberos_service_name: str = ...,
        sasl_kerberos_domain_name: str | None = ...,
        sasl_oauth_token_provider: AbstractTokenProvider | None = ...,
    ) -> None: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def create_topics(
        self, new_topics: list[NewTopic], timeout_ms: int | None = None, validate_only: bool = False
    ) -> _CreateTopicsResponse: ...
    async def delete_topics(self, topics: list[str], timeout_ms: int | None = None) -> _DeleteTopicsResponse: ...
    async def list_topics(self) -> list[str]: ...
    # MetadataResponse topics as dicts: "error_code", "topic", "is_internal", "partitions" (each a dict
    # with "error_code", "partition", "leader", "replicas", "isr", ...).
    async def describe_topics(self, topics: list[str] | None = None) -> list[dict[str, Any]]: ...
    async def describe_cluster(self) -> dict[str, Any]: ...
    async def describe_configs(
        self, config_resources: list[ConfigResource], include_synonyms: bool = False
    ) -> list[_DescribeConfigsResponse]: ...
    async def alter_configs(self, config_resources: list[ConfigResource]) -> list[_AlterConfigsResponse]: ...
    async def create_partitions(
        self, topic_partitions: dict[str, NewPartitions], timeout_ms: int | None = None, validate_only: bool = False
    ) -> _CreatePartitionsResponse: ...
    async def describe_consumer_groups(
        self,
        group_ids: list[str],
        group_coordinator_id: int | None = None,
        include_authorized_operations: bool = False,
    ) -> list[Response]: ...
    async def list_consumer_groups(self, broker_ids: list[int] | None = None) -> list[tuple[Any, ...]]: ...
    async def find_coordinator(self, group_id: str, coordinator_type: int = 0) -> int: ...
    async def list_consumer_group_offsets(
        self,
        group_id: str,
        group_coordinator_id: int | None = None,
        partitions: list[TopicPartition] | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata]: ...
    async def delete_records(
        self, records_to_delete: dict[TopicPartition, RecordsToDelete], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]: ...
