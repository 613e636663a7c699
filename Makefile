# Two commands: `make up` serves both models at http://127.0.0.1:8000,
# `make test` runs the suite. Both install what they need first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STORE  ?= model_store
STAMP  := $(VENV)/.installed

.PHONY: install models up test test-fast bench clean

install: $(STAMP)

$(STAMP): $(wildcard requirements/*.txt) scripts/install.sh
	bash scripts/install.sh
	touch $@

# Rebuilt when the export script changes; skips models already prepared.
models: install
	$(PY) scripts/prepare_model.py --store $(STORE)

up: models
	$(PY) scripts/stack.py --model-store $(STORE)

test: models
	$(PY) -m pytest

test-fast: models
	$(PY) -m pytest tests/unit

bench: models
	$(PY) benchmarks/core.py

clean:
	rm -rf $(VENV) $(STORE) .pytest_cache .hypothesis
