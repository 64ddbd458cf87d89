# Every target works on a fresh machine: `make demo` and `make test` run `make setup` first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test demo lint bench gpu-wheels clean

setup: $(STAMP)

$(STAMP): requirements-lock.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-lock.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/pe-interp reproduce --preset quick --out runs/reproduce-quick

lint: setup
	$(VENV)/bin/ruff check pe_interp probes tests benchmarks
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) benchmarks/model_step.py
	$(PY) benchmarks/tasks.py
	$(PY) benchmarks/ablation.py
	$(PY) benchmarks/patching.py

# Wheels for benchmarks/gpu_check.sh on the lent GPU machine (carry [".gpu-wheels"]).
gpu-wheels:
	PYTHON=$(PYTHON) bash benchmarks/gpu_wheels.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
