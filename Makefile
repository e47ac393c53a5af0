# The two commands a newcomer needs: `make demo` and `make test`. Each creates or updates the local
# virtual environment first (idempotent: the stamp file is rebuilt only when the requirements change).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.workbench-installed
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.bench-installed

# Two CPU cores: torch's default OpenMP spinning makes runs 10-15x slower next to any other process.
export OMP_WAIT_POLICY ?= PASSIVE
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS ?= 1

.PHONY: venv demo test test-browser lint format bench bench-peers lab clean-cache gpu-check pairs real-pair

$(STAMP): pyproject.toml requirements-nodeps.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m ipykernel install --sys-prefix --name hacpo-workbench --display-name "HACPO workbench" >/dev/null
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m workbench demo

test: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

# The tiny pairs' comparison behind docs/results.md: the state, size and model pairs under HACPO, GSPO, GSPO×2
# and Naive, plus HACPO with byte-normalized ratios on the model pair, 3 seeds each (experiments/pairs/*.yaml),
# then the committed summary (results/summary/) and the generated section of docs/results.md. ≈1-2 h on 2
# cores; rerunning it resumes or skips finished runs.
PAIR_METHODS ?= hacpo gspo gspo_x2 naive
pairs: $(STAMP)
	for pair in model state size; do for method in $(PAIR_METHODS); do \
	  $(PY) -m workbench run experiments/pairs/$$pair.yaml --set algorithm=$$method output.root=results/pairs || exit $$?; \
	done; done
	$(PY) -m workbench run experiments/pairs/model.yaml --set algorithm=hacpo label=hacpo-bytes \
	  hacpo.ratio_normalization=bytes output.root=results/pairs
	$(PY) -m workbench summarize results/pairs --readme docs/results.md

# The real pair's comparison (experiments/real_pair.yaml: warm-started SmolLM2-135M-Instruct + Gemma-3-270M,
# LoRA, CPU): GSPO, HACPO, HACPO with byte-normalized ratios and HACPO without the capability-aware baseline
# (the paper's -Adv ablation) for each seed of REAL_PAIR_SEEDS, then its committed summary
# (results/summary/real_pair/, the generated section of docs/results_real_pair.md). 8 runs, one after another:
# ≈ 8 h on 2 cores (a HACPO run alone took 63 min; docs/results_real_pair.md has faster ways);
# finished runs are skipped (the committed ones in results/real_pair/ too), unfinished ones resume, also
# when made by an earlier code version (--reuse-other-code: the summary lists each method's code version).
# REAL_PAIR_SEEDS=0,1,2 adds a third seed and REAL_PAIR_METHODS="gspo hacpo gspo_x2" adds GSPO×2.
REAL_PAIR_METHODS ?= gspo hacpo
REAL_PAIR_SEEDS ?= 0,1
real-pair: $(STAMP)
	for method in $(REAL_PAIR_METHODS); do \
	  $(PY) -m workbench run experiments/real_pair.yaml --seeds $(REAL_PAIR_SEEDS) --reuse-other-code \
	    --set algorithm=$$method output.root=results/real_pair || exit $$?; \
	done
	for variant in "hacpo-bytes hacpo.ratio_normalization=bytes" "hacpo-adv hacpo.capability_baseline=false"; do \
	  set -- $$variant; \
	  $(PY) -m workbench run experiments/real_pair.yaml --seeds $(REAL_PAIR_SEEDS) --reuse-other-code \
	    --set algorithm=hacpo label=$$1 $$2 output.root=results/real_pair || exit $$?; \
	done
	$(PY) -m workbench summarize results/real_pair --out results/summary/real_pair \
	  --readme docs/results_real_pair.md

lint format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP) $(BENCH_STAMP)
	$(PY) bench/run_all.py

# The peers benchmark runs TRL's GRPOTrainer in a bench-only venv (never a workbench dependency), with the
# workbench's torch and transformers pins: bench/requirements-peers.txt.
$(BENCH_STAMP): bench/requirements-peers.txt
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -r bench/requirements-peers.txt
	@touch $(BENCH_STAMP)

bench-peers: $(STAMP) $(BENCH_STAMP)
	$(PY) bench/bench_peers.py --trl-python $(BENCH_VENV)/bin/python

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --no-browser --allow-root --ip=127.0.0.1 notebooks/

# Every notebook opened in JupyterLab in a headless chromium and run with "Run All Cells" (tests/test_browser.py,
# ≈6 min on 2 cores). Needs Debian's chromium (≈480 MB; CI does not install it, so there the test is skipped
# with its reason): apt-get install -y chromium. playwright itself is a dev dependency (no browser download).
test-browser: $(STAMP)
	@command -v chromium >/dev/null || { echo "make test-browser needs chromium: apt-get install -y chromium"; exit 2; }
	$(PY) -m pytest -s -rs tests/test_browser.py

# Every GPU check in one run, written to results/gpu_check/report.md (docs/gpu.md): the gpu-marked tests, two
# HACPO steps of a random-weight Qwen3-1.7B-shaped 4-bit agent at 1,024 new tokens beside the memory plan, and
# eager vs compiled decode. It runs on the machine's own CUDA python and never builds
# the CPU venv (a GPU machine may have no network): the venv's python when it exists (after installing a CUDA
# torch into it), else python3; override with GPU_PYTHON=...
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py --out results/gpu_check

clean-cache:
	rm -rf $${HACPO_CACHE:-$$HOME/.cache/hacpo-workbench}
