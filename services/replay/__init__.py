"""The recorded-results service used by replays (services/replay/responder.py)."""
