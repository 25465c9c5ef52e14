"""Performance: throughput, latency and CPU of the stack and of its parts, each against a floor or a goal
(docs/benchmarks.md). ``proc_cpu`` and ``scripted_agent`` are helpers the others share."""
