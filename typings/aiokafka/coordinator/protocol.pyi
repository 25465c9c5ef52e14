from collections.abc import Sequence
from typing import NamedTuple

from aiokafka.protocol.struct import Struct
from aiokafka.structs import TopicPartition

class ConsumerProtocolMemberMetadata(Struct):
    version: int
    subscription: list[str]
    # A nullable Bytes field: None when the member sent no user data.
    user_data: bytes | None
    def __init__(self, version: int, subscription: Sequence[str], user_data: bytes | None) -> None: ...

class ConsumerProtocolMemberAssignment(Struct):
    class Assignment(NamedTuple):
        topic: str
        partitions: list[int]

    version: int
    # Decoded from the wire as plain (topic, partitions) pairs.
    assignment: list[tuple[str, list[int]]]
    user_data: bytes | None
    def __init__(
        self, version: int, assignment: Sequence[tuple[str, Sequence[int]]], user_data: bytes | None
    ) -> None: ...
    def partitions(self) -> list[TopicPartition]: ...

class ConsumerProtocol:
    PROTOCOL_TYPE: str
    ASSIGNMENT_STRATEGIES: tuple[str, ...]
    METADATA: type[ConsumerProtocolMemberMetadata]
    ASSIGNMENT: type[ConsumerProtocolMemberAssignment]
