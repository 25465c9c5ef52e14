"""The client: ``AgentClient`` (submit, wait, stream, read a run's history, decide approvals) and the
watcher of ``agent.outcomes`` it waits on."""
