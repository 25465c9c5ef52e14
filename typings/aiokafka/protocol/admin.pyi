from typing import Any, ClassVar

from aiokafka.protocol.struct import Struct

class CreateAclsResponse_v1(Struct):
    creation_responses: list[tuple[int, str]]

class CreateAclsRequest_v1(Struct):
    API_KEY: ClassVar[int]
    API_VERSION: ClassVar[int]
    def __init__(self, creations: list[tuple[Any, ...]]) -> None: ...

class DescribeAclsRequest:
    def __init__(self, resource_type: int, resource_name: str | None, resource_pattern_type_filter: int,
                 principal: str | None, host: str | None, operation: int, permission_type: int) -> None: ...

class DescribeClientQuotasRequest:
    def __init__(self, components: list[tuple[str, int, str]], strict: bool) -> None: ...
