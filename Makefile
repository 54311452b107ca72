# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use and install Conveyor into it (editable, with dev tools).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test faults lint typecheck check bench docs docs-serve clean

$(BIN)/conveyor: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/conveyor
	$(BIN)/conveyor demo

test: $(BIN)/conveyor
	$(BIN)/pytest $(PYTEST_ARGS)

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
