"""agentstream's benchmarks and fault suites: the measurements behind docs/benchmarks.md.

Not part of the installed package. Every script runs as a module from the repository root
(``.venv/bin/python -m bench.perf.pipeline --help``) and imports the others absolutely
(``from bench.chaos.chaos_procs import ...``); bench/README.md lists them.
"""
