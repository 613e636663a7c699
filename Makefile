# Two commands: `make up` serves both models at http://127.0.0.1:8000,
# `make test` runs the suite. Both install what they need first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STORE  ?= model_store
STAMP  := $(VENV)/.installed

.PHONY: install models up test test-fast bench clean

install: $(STAMP)

# What scripts/install.sh reads (not bench.txt, which make bench installs, nor gpu.txt).
$(STAMP): $(filter-out requirements/bench.txt requirements/gpu.txt,$(wildcard requirements/*.txt)) scripts/install.sh
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

# Funnel against service-streamer, LitServe and plain Flask (benchmarks/README.md), both models,
# both comparisons; about 70 minutes on 2 cores. The peers (requirements/bench.txt) are installed
# into .venv once. Smoke check: make bench BENCH_ARGS=--quick. Core numbers: python benchmarks/core.py
bench: models
	@[ $(VENV)/.bench-installed -nt requirements/bench.txt ] || \
		{ bash benchmarks/install.sh && touch $(VENV)/.bench-installed; }
	$(PY) benchmarks/bench.py --models text-embedding,image-classifier --suite same,default $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(STORE) .pytest_cache .hypothesis
