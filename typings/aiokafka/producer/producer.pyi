import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from ssl import SSLContext
from types import TracebackType
from typing import Literal, Self

from aiokafka.abc import AbstractTokenProvider
from aiokafka.structs import OffsetAndMetadata, RecordMetadata, TopicPartition

# Keys and values are raw bytes: the stub accepts no serializer (agentstream configures none).
class AIOKafkaProducer:
    def __init__(
        self,
        *,
        bootstrap_servers: str | list[str] = ...,
        client_id: str | None = ...,
        metadata_max_age_ms: int = ...,
        request_timeout_ms: int = ...,
        acks: Literal[0, 1, -1, "all"] = ...,
        key_serializer: None = None,
        value_serializer: None = None,
        compression_type: Literal["gzip", "snappy", "lz4", "zstd"] | None = ...,
        max_batch_size: int = ...,
        partitioner: Callable[[bytes | None, Sequence[int], Sequence[int]], int] = ...,
        max_request_size: int = ...,
        linger_ms: int = ...,
        retry_backoff_ms: int = ...,
        security_protocol: str = ...,
        ssl_context: SSLContext | None = ...,
        connections_max_idle_ms: int | None = ...,
        enable_idempotence: bool = ...,
        transactional_id: str | None = ...,
        transaction_timeout_ms: int = ...,
        sasl_mechanism: str = ...,
        sasl_plain_password: str | None = ...,
        sasl_plain_username: str | None = ...,
        sasl_kerberos_service_name: str = ...,
        sasl_kerberos_domain_name: str | None = ...,
        sasl_oauth_token_provider: AbstractTokenProvider | None = ...,
    ) -> None: ...
    async def start(self) -> None: ...
    async def flush(self) -> None: ...
    async def stop(self) -> None: ...
    async def partitions_for(self, topic: str) -> set[int]: ...
    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[RecordMetadata]: ...
    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> RecordMetadata: ...
    async def begin_transaction(self) -> None: ...
    async def commit_transaction(self) -> None: ...
    async def abort_transaction(self) -> None: ...
    def transaction(self) -> AbstractAsyncContextManager[None]: ...
    async def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int | tuple[int, str] | OffsetAndMetadata], group_id: str
    ) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
