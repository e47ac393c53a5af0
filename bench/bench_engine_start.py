"""Benchmark: a vLLM server's start-up and memory on CPU with the model in the engine core process (what
`workbench.agents.generation.vllm_engine.EngineServer` starts: ``--distributed-executor-backend uni``,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) vs vLLM's CPU default (a separate worker process), A B A B in one run.

Each start serves the real pair's merged Gemma-3 warm start (eager, one thread) until ``/health`` answers;
then one sampled request, one in-place reload, and the PSS summed over the server's processes. Prints each
start and the medians. Needs the engine environment (``make engine``; without it, it says so and exits).

    .venv/bin/python bench/bench_engine_start.py [--reps 2] [--model warm:gemma3-addsub2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import psutil

from workbench.agents.generation.vllm_engine import EngineError, EngineServer, engine_python
from workbench.agents.models.loading import resolve_model_source

_UNI = ["--distributed-executor-backend", "uni"]


def _vllm_default(command: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
    """Popen of the server without the workbench's executor options: vLLM's CPU default."""
    i = command.index(_UNI[0])
    env = {k: v for k, v in env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    return _POPEN(command[:i] + command[i + 2 :], env=env, **kwargs)


_POPEN = subprocess.Popen
ARMS = {"engine core (workbench)": _POPEN, "separate worker (vLLM default)": _vllm_default}


def _pss_gib(pid: int) -> float:
    process = psutil.Process(pid)
    total = 0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a process that ended meanwhile
            total += p.memory_full_info().pss
    return total / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--model", default="warm:gemma3-addsub2")
    args = parser.parse_args()
    try:
        python = engine_python()
    except EngineError as exc:  # make bench runs every benchmark: without the engine this one says why
        print(f"skipped: {exc}")
        return
    model = resolve_model_source(args.model)
    print(f"{args.model} ({model}); load average {os.getloadavg()[0]:.1f}")
    rows: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in ARMS}
    body = {"model": "policy", "prompt": ["Q: 3+4-2\nA: "], "n": 4, "temperature": 1.0, "max_tokens": 30}
    for rep in range(args.reps):
        for arm, popen in ARMS.items():
            subprocess.Popen = popen  # the server's own start-up code, with or without the options
            began = time.monotonic()
            server = EngineServer(model, python, enforce_eager=True, threads=1)
            try:
                server.start()
                start_s = time.monotonic() - began
                server.call("/v1/completions", body | {"seed": rep})
                reload_began = time.monotonic()
                server.reload(model)
                reload_s = time.monotonic() - reload_began
                rows[arm].append((start_s, reload_s, _pss_gib(server.pid)))
            finally:
                server.close()
                subprocess.Popen = _POPEN
            pss = rows[arm][-1][2]
            print(f"rep {rep} {arm}: start {start_s:.1f} s, reload {reload_s:.2f} s, PSS {pss:.2f} GiB")
    for arm, got in rows.items():
        start_s, reload_s, pss = (statistics.median(r[i] for r in got) for i in range(3))
        n = len(got)
        print(f"{arm}: median start {start_s:.1f} s, reload {reload_s:.2f} s, PSS {pss:.2f} GiB (n = {n})")


if __name__ == "__main__":
    main()
