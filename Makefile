# make demo   set up .venv (if missing) and run the main job on the embedded defaults (CPU)
# make test   set up .venv (if missing) and run the default test suite (CPU; every tier but slow and gpu, in parallel)
# make train  set up .venv (if missing) and train dit_tiny on the embedded defaults (CPU, ~5 min)
# make test-unit | test-cli | test-faults   one tier of the default suite (README.md#tests)
# make test-slow   the slow tests too
# make test-hf     install the optional extra .[hf] (transformers) and run the Hugging Face model tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# pytest-xdist: one worker per core, at most 8 (each test process then runs torch on cores/workers threads: tests/conftest.py)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -q
DEFAULT := not slow and not gpu

.PHONY: demo train test test-unit test-cli test-faults test-slow test-hf bench-figures lint clean

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
	$(PYTEST) -m "$(DEFAULT)" --durations=15

test-unit test-cli test-faults: test-%: $(STAMP)
	$(PYTEST) -m "$* and $(DEFAULT)" --durations=10

test-slow: $(STAMP)
	$(PYTEST) -m "not gpu" --durations=15

test-hf: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[hf]'
	$(PYTEST) -m "not slow and not gpu" tests/test_hf_model.py

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts kernels

clean:
	rm -rf $(VENV) outputs
