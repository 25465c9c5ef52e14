"""The re-drive bookkeeping in PostgreSQL: the backbone's (``agentstream.streams.dlq.redrives``), re-exported."""

from __future__ import annotations

from agentstream.streams.dlq.redrives import RedriveLog, already

__all__ = ["RedriveLog", "already"]
