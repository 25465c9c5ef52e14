import abc
from collections.abc import Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

class AbstractPartitionAssignor(abc.ABC):
    @property
    @abc.abstractmethod
    def name(self) -> str: ...
    @classmethod
    @abc.abstractmethod
    def assign(
        cls, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]: ...
    @classmethod
    @abc.abstractmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata: ...
    @classmethod
    @abc.abstractmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None: ...
