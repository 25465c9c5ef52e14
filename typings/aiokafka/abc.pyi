import abc
from collections.abc import Awaitable
from collections.abc import Set as AbstractSet

from aiokafka.structs import TopicPartition

class ConsumerRebalanceListener(abc.ABC):
    # aiokafka passes a frozenset (a set when nothing was assigned) and awaits the result if it is a
    # coroutine.
    @abc.abstractmethod
    def on_partitions_revoked(self, revoked: AbstractSet[TopicPartition]) -> Awaitable[None] | None: ...
    @abc.abstractmethod
    def on_partitions_assigned(self, assigned: AbstractSet[TopicPartition]) -> Awaitable[None] | None: ...

class AbstractTokenProvider(abc.ABC):
    @abc.abstractmethod
    async def token(self) -> str: ...
    def extensions(self) -> dict[str, str]: ...
