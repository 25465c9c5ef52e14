"""The defaults agentstream gives every aiokafka client: metadata requests never ask the broker to create
a topic.

Every aiokafka client (producer, consumer, admin) learns where a topic lives with a MetadataRequest, and
from protocol v4 on aiokafka sends ``allow_auto_topic_creation=True`` unless told otherwise. On a broker
with Kafka's default ``auto.create.topics.enable=true`` that makes a client's first look at a topic
create it, with the broker's default partition count and ``cleanup.policy=delete``, before the workers
create it from the catalogue (``streams/kafka/topics.py``): ``agent.outcomes`` then has 1 partition instead of
8 and every worker refuses to start. Topics are created on purpose or not at all, so the default becomes
``False`` for the whole process; a caller that passes ``allow_auto_topic_creation=True`` still gets it.

Applied by ``kafka_options`` (``streams/config/kafka_auth.py``), which every Kafka client agentstream builds
takes its options from, so it is in force before the first client exists; a process that builds clients
another way (faust, in the alerts app) calls ``disable_auto_topic_creation()`` at its start. Importing
agentstream patches nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from aiokafka.protocol.metadata import MetadataRequest

_APPLIED = "_agentstream_no_auto_create"


def disable_auto_topic_creation() -> None:
    """Make ``MetadataRequest`` default to ``allow_auto_topic_creation=False`` (idempotent)."""
    original = MetadataRequest.__init__
    if getattr(original, _APPLIED, False):
        return

    @functools.wraps(original)
    def __init__(self: MetadataRequest, topics: list[str] | None = None,
                 allow_auto_topic_creation: bool | None = None, **kwargs: Any) -> None:
        original(self, topics, False if allow_auto_topic_creation is None else allow_auto_topic_creation,
                 **kwargs)

    setattr(__init__, _APPLIED, True)
    MetadataRequest.__init__ = __init__  # type: ignore[method-assign]  # the patch is the point
