# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use and install Conveyor into it (editable, with dev tools).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test lint typecheck check bench clean

$(BIN)/conveyor: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/conveyor
	$(BIN)/conveyor demo

test: $(BIN)/conveyor
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(BIN)/conveyor
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks || true

typecheck: $(BIN)/conveyor
	$(BIN)/mypy

check: test lint typecheck

bench: $(BIN)/conveyor
	$(BIN)/python benchmarks/sqlite_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
