"""Tool service: a typed registry of async tools, executed at most once per step."""
