# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv on first
# use and install Conveyor into it (editable): the demo needs nothing more, the tests and every
# other target add the dev tools ('.[dev]': pytest, mypy, ruff, playwright, hypothesis, the
# PostgreSQL and Redis clients).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# `make demo DEMO_ARGS='--duration 30'`: options of `conveyor demo`.
DEMO_ARGS ?=

.PHONY: demo test test-fast faults lint typecheck check bench docs docs-serve clean

# The stamps are separate files: pip writes $(BIN)/conveyor on any install, so its date cannot
# tell a demo-only .venv from one with the dev tools.
VENV_READY = test -x $(BIN)/python || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet --upgrade pip; }

$(VENV)/.installed-demo: pyproject.toml
	$(VENV_READY)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml
	$(VENV_READY)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# What the targets below depend on: Conveyor with the dev tools.
$(BIN)/conveyor: $(VENV)/.installed-dev
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/conveyor demo $(DEMO_ARGS)

test: $(BIN)/conveyor
	$(BIN)/pytest $(PYTEST_ARGS)

# The suite without its two slow tiers, for the edit-test loop: the fault injection
# (tests/faults: private servers killed, paused and restarted) and the production-shape runs
# (tests/scale, the `scale` marker). Everything else runs as in `make test`, on every backend;
# with CI=true a backend whose server is down fails it too.
FAST_IGNORE = --ignore=tests/faults --ignore=tests/scale
test-fast: $(BIN)/conveyor
	$(BIN)/pytest $(FAST_IGNORE) $(PYTEST_ARGS)

# The fault-injection suite at full size (docs/reliability.md): bigger job counts, more worker
# processes, longer chaos than the CI profile `make test` runs. Each run's report is appended to
# test-output/faults-full.jsonl and printed as the table docs/reliability.md shows at the end.
FAULT_REPORT ?= test-output/faults-full.jsonl
faults: $(BIN)/conveyor
	mkdir -p $(dir $(FAULT_REPORT))
	rm -f $(FAULT_REPORT)
	CONVEYOR_FAULT_PROFILE=full CONVEYOR_FAULT_REPORT=$(FAULT_REPORT) \
		$(BIN)/pytest tests/faults --timeout=1800 $(PYTEST_ARGS); status=$$?; \
		$(BIN)/python tests/faults/report_table.py $(FAULT_REPORT); exit $$status

# R13, the soak (tests/faults/test_soak.py): ~100 jobs/s into worker processes with a random
# fault every 30 s (SIGKILL, SIGSTOP past the lease, PostgreSQL sessions terminated, Redis
# clients killed), watching each worker's RSS, the store connections and the claim latency,
# SOAK_SECONDS of load per backend (sqlite, postgres, redis in turn; the plan's nightly size is
# 7200, `make soak SOAK_SECONDS=600` a 10-minute one). The reports go to SOAK_REPORT, printed
# as a table at the end. PYTEST_ARGS='-k redis' runs one backend.
SOAK_SECONDS ?= 7200
SOAK_REPORT  ?= test-output/soak.jsonl
.PHONY: soak
soak: $(BIN)/conveyor
	mkdir -p $(dir $(SOAK_REPORT))
	rm -f $(SOAK_REPORT)
	CONVEYOR_SOAK_SECONDS=$(SOAK_SECONDS) CONVEYOR_FAULT_REPORT=$(SOAK_REPORT) \
		$(BIN)/pytest tests/faults/test_soak.py $(PYTEST_ARGS); status=$$?; \
		$(BIN)/python tests/faults/report_table.py $(SOAK_REPORT); exit $$status

# The production-shape tier (tests/scale) at full size: hours-of-load rates, a million rows, dozens
# of slots, thousands of queues. `make test` runs the same tests at a CI size; this target runs them
# big and prints the figures docs/reliability.md tabulates (appended to SCALE_REPORT).
SCALE_REPORT ?= test-output/scale.jsonl
.PHONY: scale
scale: $(BIN)/conveyor
	mkdir -p $(dir $(SCALE_REPORT))
	rm -f $(SCALE_REPORT)
	CONVEYOR_SCALE=full CONVEYOR_SCALE_REPORT=$(SCALE_REPORT) \
		$(BIN)/pytest tests/scale -m scale -s --timeout=3600 $(PYTEST_ARGS); status=$$?; \
		$(BIN)/python tests/scale/report_table.py $(SCALE_REPORT); exit $$status

lint: $(BIN)/conveyor
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks || true

typecheck: $(BIN)/conveyor
	$(BIN)/mypy

check: test lint typecheck

# Conveyor against Celery, RQ, Dramatiq, Huey, arq, procrastinate and SAQ on every store
# (docs/benchmarks.md). The first run creates benchmarks/.venv-peers with the peers installed.
# Results: benchmarks/results/<date>-<store>.md and PNG charts. BENCH_ARGS adds options.
bench: $(BIN)/conveyor
	$(BIN)/python benchmarks/run.py --rounds 3 $(BENCH_ARGS)

# A smoke run of the same harness: 500 jobs, 1 round, short latency phases (about 3 minutes).
bench-quick: $(BIN)/conveyor
	$(BIN)/python benchmarks/run.py --quick $(BENCH_ARGS)

# Scale curves (benchmarks/scale.py): claim, drain and enqueue at 1k/100k/1M waiting jobs, worker RSS
# over 1M jobs, per store. Uses benchmarks/.venv-peers if it exists (matplotlib draws the chart).
bench-scale: $(BIN)/conveyor
	$(or $(wildcard benchmarks/.venv-peers/bin/python),$(BIN)/python) benchmarks/scale.py $(BENCH_ARGS)

# The documentation site (mkdocs.yml): built into build/site, failing on any warning.
$(BIN)/mkdocs: pyproject.toml $(BIN)/conveyor
	$(BIN)/pip install --quiet -e '.[dev,docs]'
	touch $@

docs: $(BIN)/mkdocs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(BIN)/mkdocs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
