from ssl import SSLContext
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.cluster import ClusterMetadata

class AIOKafkaClient:
    cluster: ClusterMetadata
    def __init__(
        self,
        *,
        bootstrap_servers: str | list[str] = ...,
        client_id: str = ...,
        metadata_max_age_ms: int = ...,
        request_timeout_ms: int = ...,
        retry_backoff_ms: int = ...,
        ssl_context: SSLContext | None = ...,
        security_protocol: str = ...,
        connections_max_idle_ms: int | None = ...,
        sasl_mechanism: str = ...,
        sasl_plain_username: str | None = ...,
        sasl_plain_password: str | None = ...,
        sasl_kerberos_service_name: str = ...,
        sasl_kerberos_domain_name: str | None = ...,
        sasl_oauth_token_provider: AbstractTokenProvider | None = ...,
    ) -> None: ...
    async def bootstrap(self) -> None: ...
    def get_random_node(self) -> int: ...
    async def send(self, node_id: int, request: Any) -> Any: ...
    async def close(self) -> None: ...
