# Two commands: `make up` serves both models at http://127.0.0.1:8000,
# `make test` runs the suite. Both install what they need first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STORE  ?= model_store
STAMP  := $(VENV)/.installed

.PHONY: install models up test test-fast lint bench clean

install: $(STAMP)

# pip installs the project (pyproject.toml) and the client (client/) into .venv, editable.
$(STAMP): pyproject.toml client/pyproject.toml $(wildcard requirements/apt*.txt) scripts/install.sh
	bash scripts/install.sh
	touch $@

# Rebuilt when the export code changes; skips models already prepared.
models: install
	$(VENV)/bin/funnel prepare --store $(STORE)

up: models
	$(VENV)/bin/funnel up --model-store $(STORE)

test: models
	$(PY) -m pytest

test-fast: models
	$(PY) -m pytest tests/unit

# Ruff (lint + import order) on everything, mypy on the public names (funnel) and the three packages, and the
# import contract between the tiers (import-linter, pyproject.toml's [tool.importlinter]). Both read the
# packages under their installed names (funnel.common, ...) through a tree of links in .lint/.
lint: install
	$(VENV)/bin/ruff check .
	@mkdir -p .lint/funnel && for p in common web worker scripts; do ln -sfn ../../$$p .lint/funnel/$$p; done
	@ln -sfn ../../sdk/__init__.py .lint/funnel/__init__.py
	cd .lint && MYPYPATH=. ../$(VENV)/bin/mypy --config-file ../pyproject.toml -p funnel.common -p funnel.web -p funnel.worker -m funnel
	cd .lint && ../$(VENV)/bin/lint-imports --config ../pyproject.toml

# Funnel against service-streamer, LitServe, plain Flask, infinity and Ray Serve (benchmarks/README.md), both models,
# both comparisons; about 70 minutes on 2 cores. The peers (pyproject's bench extra) are installed
# into .venv once. Smoke check: make bench BENCH_ARGS=--quick. Core numbers: python -m benchmarks.core
bench: models
	@[ $(VENV)/.bench-installed -nt pyproject.toml ] || \
		{ bash benchmarks/install.sh && touch $(VENV)/.bench-installed; }
	$(PY) -m benchmarks.bench --models text-embedding,image-classifier --suite same,default $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(STORE) .pytest_cache .hypothesis .lint .mypy_cache .ruff_cache
