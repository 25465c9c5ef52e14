"""The agent rules and the event vocabulary: events, the closed sets of strings (kinds), actions, task
rules, tools as the model sees them, outage classification and the public errors. Pure: no I/O, and no
import from any other part of the backbone (import-linter keeps it at the bottom)."""
