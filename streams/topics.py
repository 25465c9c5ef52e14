"""Topics: specifications and idempotent creation.

Topics are created on purpose (the broker has ``auto.create.topics.enable=false``), with their
partition count and configs stated here, so a typo never creates a topic and a compacted topic is
never created as a deleting one by a producer that got there first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code

from streams.errors import AgentStreamError

_TOPIC_ALREADY_EXISTS = 36


class TopicMismatch(AgentStreamError):
    """An existing topic has a different partition count than its specification."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replication_factor: int = 1
    configs: Mapping[str, str] = field(default_factory=dict)


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], *, timeout_ms: int = 30000) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Raises ``TopicMismatch`` when an existing topic has fewer or more partitions than specified
    (keys would hash to other partitions than the code expects), and the broker's error for any
    other failure.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs)) for s in specs],
            timeout_ms=timeout_ms,
        )
        created: list[str] = []
        existing: list[str] = []
        for entry in response.topic_errors:
            name, code = entry[0], entry[1]
            if code == 0:
                created.append(name)
            elif code == _TOPIC_ALREADY_EXISTS:
                existing.append(name)
            else:
                message = entry[2] if len(entry) > 2 else ""
                raise for_code(code)(f"creating topic {name}: {message}")
        if existing:
            wanted = {s.name: s.partitions for s in specs}
            for description in await admin.describe_topics(existing):
                have = len(description["partitions"])
                if have != wanted[description["topic"]]:
                    raise TopicMismatch(
                        f"topic {description['topic']} has {have} partitions, the catalogue says "
                        f"{wanted[description['topic']]}; migrate it (or delete it in development)"
                    )
        return created
    finally:
        await admin.close()
