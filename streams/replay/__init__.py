"""Replay for debugging: a run's timeline (``timeline``, ``html``), deterministic re-execution and forks
on an isolated pipeline (``rerun``), per-step comparison (``diff``), and the ``agentstream replay`` CLI
(``cli``). See docs/replay.md."""
