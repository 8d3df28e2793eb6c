# cdcflow — the two entry points of the README: `make demo` and `make test`.
# Each bootstraps its own environment: installs uv if missing, then the locked dependencies.
SHELL := /bin/bash
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
export PATH := $(HOME)/.local/bin:$(PATH)

.PHONY: bootstrap spark-jars demo test lint typecheck unit clean

bootstrap:
	@command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet --user uv || python3 -m pip install --quiet uv
	@uv sync --frozen --all-extras --quiet

# Delta Lake jars for the Spark engine, fetched with Maven into ./.spark-jars (idempotent)
spark-jars: bootstrap
	bash scripts/spark/fetch-jars.sh

demo: bootstrap
	uv run cdcflow demo

lint: bootstrap
	uv run ruff check src tests bench
	uv run ruff format --check src tests bench

typecheck: bootstrap
	uv run mypy src

unit: bootstrap spark-jars
	uv run pytest -q

test: lint typecheck unit

clean:
	rm -rf lakehouse landing demo .pytest_cache .mypy_cache .ruff_cache
