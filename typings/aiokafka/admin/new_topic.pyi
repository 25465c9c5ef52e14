from collections.abc import Mapping, Sequence

class NewTopic:
    name: str
    num_partitions: int
    replication_factor: int
    replica_assignments: Mapping[int, Sequence[int]]
    topic_configs: Mapping[str, str]
    def __init__(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        replica_assignments: Mapping[int, Sequence[int]] | None = None,
        topic_configs: Mapping[str, str] | None = None,
    ) -> None: ...
