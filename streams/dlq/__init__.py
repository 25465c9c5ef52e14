"""Dead letters for people: browse the dead-letter topic of a cell and re-drive letters to their source
topic (``DeadLetters``), the views of them (``letters``) and the re-drive bookkeeping in PostgreSQL
(``redrives``, migration 0009).

In the backbone so that both fronts share one implementation: ``agentstream dlq`` (the application layer,
``agentstream.ops.dlq`` re-exports this) and the gateway's ``/v1/dead-letters`` (a service, which may
import only the backbone). Building and publishing letters on the hot path is the runtime's
(``agentstream.streams.runtime.dead_letters``).
"""

from agentstream.streams.dlq.dead_letters import DeadLetters, redrivable_topics
from agentstream.streams.dlq.letters import (
    REDRIVE_HEADER,
    LetterDetails,
    RedriveAction,
    RedriveResult,
    StoredLetter,
    ValueFrom,
    readable,
)

__all__ = ["REDRIVE_HEADER", "DeadLetters", "LetterDetails", "RedriveAction", "RedriveResult", "StoredLetter",
           "ValueFrom", "readable", "redrivable_topics"]
