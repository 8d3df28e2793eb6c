# cdcflow — the two entry points of the README: `make demo` and `make test`.
# Each bootstraps its own environment (scripts/bootstrap.sh: uv if missing, then the locked
# dependencies into ./.venv); `make test` also installs and starts the services its tests need.
# Afterwards the project's tools are in .venv/bin (no PATH change needed): .venv/bin/cdcflow …
SHELL := /bin/bash
export PATH := $(HOME)/.local/bin:$(PATH)
# pytest-xdist: three workers; each xdist_group (Spark, Spark crash, PostgreSQL, docs:
# tests/conftest.py) stays on one worker; work units in collection order (the long groups
# first: tests/conftest.py GROUP_ORDER); the 25 slowest tests are listed at the end.
# PYTEST_ARGS= runs in one process.
PYTEST_ARGS ?= -n 3 --dist loadgroup --no-loadscope-reorder --durations=25

.PHONY: bootstrap spark-jars demo demo-s3 run test lint typecheck unit clean mutation peers

bootstrap:
	@bash scripts/bootstrap.sh

# Java 17 + Maven (apt, when missing), then the Delta Lake jars for the Spark engine into
# ./.spark-jars (idempotent)
spark-jars: bootstrap
	@bash scripts/spark/install.sh
	@bash scripts/spark/fetch-jars.sh

demo: bootstrap
	.venv/bin/cdcflow demo

# the demo with its lakehouse and checkpoint on the local S3 server (moto; docs/objectstore.md)
demo-s3: bootstrap
	bash scripts/objectstore/demo-s3.sh $(ARGS)

# any cdcflow command: make run ARGS="reconcile --config config/dev.yaml --expected expected.parquet"
run: bootstrap
	.venv/bin/cdcflow $(ARGS)

lint: bootstrap
	uv run ruff check src tests bench
	uv run ruff format --check src tests bench

typecheck: bootstrap
	uv run mypy src

# PostgreSQL 15 + wal2json installed and started for the tests, stopped afterwards
# (scripts/with-services.sh); Spark's Java, Maven and jars by spark-jars
unit: bootstrap spark-jars
	bash scripts/with-services.sh uv run pytest -q $(PYTEST_ARGS)

test: lint typecheck unit

# cdcflow against a DuckDB MERGE loop and a dlt merge pipeline on one data set (bench/peers.py,
# docs/performance.md); dlt is fetched for this run only. A benchmark: neither `make test` nor CI.
# make peers ARGS="--events 200000 --customers 20000"
peers: bootstrap
	uv run --with 'dlt[duckdb]' python bench/peers.py $(ARGS)

# mutation testing (mutmut, [tool.mutmut] in pyproject.toml, docs/mutation.md) of plan/, model/
# and the local fold against the fast unit tests; slow (tens of minutes), so neither part of
# `make test` nor of CI. A fresh run each time; then `uv run mutmut show NAME` for one survivor.
mutation: bootstrap
	rm -rf mutants
	uv run mutmut run --max-children 2
	uv run mutmut results

clean:
	rm -rf lakehouse landing demo .pytest_cache .mypy_cache .ruff_cache
