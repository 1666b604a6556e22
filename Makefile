# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make run    serve the shipped model bundle on the built-in demo cluster (http://127.0.0.1:8888)
#   make test   lint and run the whole test suite (installs Prometheus through apt-get when root)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint models bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m extender

test: $(STAMP)
	scripts/ensure-prometheus
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
