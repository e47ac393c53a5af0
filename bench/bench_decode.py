"""Benchmark: the decode loop eager vs compiled (``train.compile_decode``) on CPU, same prompts and outputs.

For each model: one compiled call first (its time is the compile time), then ``--reps`` alternating eager /
compiled calls of ``generate`` (greedy, ``--rows`` rows of ``--tokens`` new tokens); prints the medians in
generated tokens per second, their ratio, and whether both loops produced the same tokens. On CPU inductor
compiles C++ kernels and there are no CUDA graphs, so this measures the static-cache loop plus inductor's
fusion, not what CUDA graphs do to kernel-launch overhead (``make gpu-check`` measures that on a GPU).

    .venv/bin/python bench/bench_decode.py [--models tiny:llama-bpe smollm2-135m-instruct] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workbench.agents.generation.rollout import generate
from workbench.agents.models.loading import load_agent


def _run(agent, prompts: list[str], n: int, tokens: int, compiled: bool) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = generate(agent, prompts, n=n, temperature=0.0, max_new_tokens=tokens, compile_decode=compiled)
    seconds = time.perf_counter() - start
    return sum(r.length for r in out) / seconds, [r.response_ids for r in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny:llama-bpe", "smollm2-135m-instruct"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    prompts = [f"What is {i} + {2 * i + 1}?" for i in range(args.rows // 2)]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rows} rows x {args.tokens} new tokens, greedy")
    print("| model | eager tok/s | compiled tok/s | compiled / eager | compile (first call) | same tokens |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        agent = load_agent({"model": model, "device": "cpu"})
        start = time.perf_counter()
        _, first = _run(agent, prompts, 2, args.tokens, True)
        compile_s = time.perf_counter() - start
        eager, compiled, same = [], [], True
        for _ in range(args.reps):
            rate, eager_ids = _run(agent, prompts, 2, args.tokens, False)
            eager.append(rate)
            rate, compiled_ids = _run(agent, prompts, 2, args.tokens, True)
            compiled.append(rate)
            same = same and eager_ids == compiled_ids == first
        e, c = statistics.median(eager), statistics.median(compiled)
        print(f"| {model} | {e:.0f} | {c:.0f} | {c / e:.2f} | {compile_s:.0f} s | {same} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
