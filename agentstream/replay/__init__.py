"""Replay orchestration: re-running a recorded run on an isolated pipeline (``rerun``) and the
``agentstream replay`` CLI (``cli``). Reading a run (timeline, diff, HTML) is the backbone's
(``agentstream.streams.replay``)."""
