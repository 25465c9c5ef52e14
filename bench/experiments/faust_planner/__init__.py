"""The planner's core loop as a faust-streaming app (``app``), started by ``bench.experiments.faust_vs_runtime``."""
