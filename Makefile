# make demo   set up .venv (if missing) and run the main job on the embedded defaults (CPU)
# make test   set up .venv (if missing) and run the default (fast, CPU) test suite
# make train  set up .venv (if missing) and train dit_tiny on the embedded defaults (CPU, ~5 min)
# make test-slow   the slow tests too
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo train test test-slow bench-figures lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/numdev-demo

train: $(STAMP)
	$(BIN)/numdev-train

bench-figures: $(STAMP)
	for e in $$($(BIN)/numdev-figure --list bench); do $(BIN)/numdev-bench experiment=$$e || exit 1; done

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu" -q --durations=15

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu" -q

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts kernels

clean:
	rm -rf $(VENV) outputs
