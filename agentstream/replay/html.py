"""The timeline as one self-contained HTML file: moved to the backbone (``agentstream.streams.replay.html``)
so that the HTTP gateway can serve it too (services may not import the application layer); these names stay
importable from here."""

from agentstream.streams.replay.html import (
    BUDGET_COLOURS,
    LANE_COLOURS,
    TRANSPORT,
    gantt,
    render,
    script_source,
)

__all__ = ["BUDGET_COLOURS", "LANE_COLOURS", "TRANSPORT", "gantt", "render", "script_source"]
