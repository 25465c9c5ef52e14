"""agentstream services: planner, inference, retrieval, tools (one package each)."""
