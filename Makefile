# make test  - set everything up (.venv, every extra the tests need) and run ruff, mypy, pytest
# make bench - set everything up and run the main job
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp

.PHONY: test bench lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[torch,transformers,s3,p2p,metrics,bench,dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy --strict src

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/kvtier bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
