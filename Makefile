# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use and install Conveyor into it (editable, with dev tools).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test lint typecheck check bench docs docs-serve clean

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
