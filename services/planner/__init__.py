"""Planner service: the per-run state machine (model → tool / retrieval / answer → loop)."""
