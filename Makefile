# The README's two commands are `make run` and `make test`; both set up .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install arm-core with its test tools

run: $(STAMP) ## run the whole stack on embedded PostgreSQL and NATS (arm-core dev)
	$(BIN)/arm-core dev

lint: $(STAMP) ## ruff, mypy and the import boundaries (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p arm_core -p tests -p benchmarks
	$(BIN)/lint-imports --no-cache

test: lint ## lint, then the whole test suite against real PostgreSQL and nats-server
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The bench extra (PgQueuer + asyncpg, the reference queue) is installed on demand.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) ## figures next to same-run references (BENCH_ARGS=--quick, --only sweep,retry)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

chaos: $(STAMP) ## faults against real processes: lost, applied twice, stuck, recovery (CHAOS_ARGS=--quick)
	$(BIN)/python -m benchmarks.chaos $(CHAOS_ARGS)

schema: $(STAMP) ## rewrite db/schema.sql from a freshly migrated database (review its diff)
	$(BIN)/python -m arm_core.devtools.schema_snapshot --write

docs: $(STAMP) ## render docs/architecture.svg (needs graphviz), write docs/configuration.md
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg
	$(BIN)/python -m arm_core.devtools.config_doc --write

.PHONY: help install run lint test bench chaos schema docs
