# empo2_jax — set-up, tests, the main job and benchmarks.
# `make test` creates .venv (Python 3.11) on first use, installs the requirements once
# (a stamp file records it; editing a requirements file reinstalls), then runs pytest.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
REQS   := requirements.txt requirements-dev.txt requirements-nodeps.txt

.PHONY: test test-fast train bench clean-venv

$(STAMP): $(REQS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

train: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) launch/train.py --config=configs/sciworld.py:cpu --workdir=runs/cpu

bench: $(STAMP)
	@for b in bench/[a-z]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
