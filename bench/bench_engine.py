"""Benchmark: rollouts of the real pair's agents from the built-in loop (``train.engine: hf``) vs vLLM
(``train.engine: vllm``, compiled and eager), side by side in one run.

For each agent of ``experiments/real_pair.yaml`` (warm start + the recipe's LoRA adapter, perturbed so that
merging changes the weights), for the compiled and then the eager server (one at a time: each holds gigabytes
of RAM): its start-up, then ``--reps`` rounds calling the hf loop and the server in turn on the same prompts
(``--prompts`` × G samples at temperature 1, the recipe's length cap), each followed by a `VLLMEngine.sync`
(writing the merged policy and reloading it). Prints medians of generated tokens per second, the ratios to the
hf loop, the start-ups, the median sync time and the per-token gap between vLLM's log-probs of its samples and
the trainer's scoring pass (mean and max over every sampled token). Needs the engine environment
(``make engine``; without it, it says so and exits).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_engine.py [--prompts 8] [--reps 3] [--agents gemma3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from workbench.agents.generation.rollout import generate
from workbench.agents.generation.vllm_engine import EngineError, VLLMEngine, engine_python
from workbench.agents.models.loading import load_agent
from workbench.config.loading import load_experiment
from workbench.core.env import PROJECT_ROOT
from workbench.tasks.arithmetic import embedded_task
from workbench.train.batches import UpdateSettings
from workbench.train.scoring import sampler_log_ratios, score_own


def _rate(sample, *args, **kwargs) -> tuple[float, list]:
    start = time.perf_counter()
    rollouts = sample(*args, **kwargs)
    return sum(len(r.response_ids) for r in rollouts) / (time.perf_counter() - start), rollouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--agents", nargs="+", help="agent names of the recipe (default: both)")
    args = parser.parse_args()
    cfg = load_experiment(PROJECT_ROOT / "experiments" / "real_pair.yaml")
    t = cfg.train
    items = embedded_task(split="train", n=args.prompts, seed=0, **dict(cfg.task.knobs))
    prompts = [item.question for item in items]
    try:
        python = engine_python()
    except EngineError as exc:  # make bench runs every benchmark: without the engine this one says why
        print(f"skipped: {exc}")
        return
    threads = torch.get_num_threads()
    print(
        f"threads {threads}; load average {os.getloadavg()[0]:.1f}; {args.prompts} prompts x G {t.group_size}"
    )
    columns = ["agent", "hf tok/s", "vLLM tok/s", "vLLM eager tok/s", "vLLM / hf", "eager / hf", "start"]
    print("| " + " | ".join([*columns, "start eager", "sync", "gap mean", "gap max"]) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in [a for a in cfg.agents if not args.agents or a.name in args.agents]:
        agent = load_agent(spec)
        with torch.no_grad():
            for name, param in agent.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 1e-3)
        kwargs = dict(temperature=t.temperature, top_p=t.top_p, max_new_tokens=t.max_new_tokens, author=0)
        rates: dict[str, list[float]] = {"hf": [], "vllm": [], "eager": []}
        starts, syncs, gaps = {}, [], []
        for key, eager in (("vllm", False), ("eager", True)):  # one server at a time: each holds GBs of RAM
            began = time.perf_counter()
            engine = VLLMEngine(agent, python, enforce_eager=eager, threads=threads).start()
            starts[eager] = time.perf_counter() - began
            try:
                for rep in range(args.reps):  # the built-in loop and the server in turn, same prompts, seed
                    rates["hf"].append(_rate(generate, agent, prompts, t.group_size, seed=rep, **kwargs)[0])
                    rate, rollouts = _rate(engine.generate, prompts, t.group_size, seed=rep, **kwargs)
                    rates[key].append(rate)
                    scores = score_own(agent, rollouts, UpdateSettings(temperature=t.temperature))
                    gaps.extend(sampler_log_ratios(rollouts, scores))
                    engine.sync()
                    syncs.append(engine.sync_seconds)
            finally:
                engine.close()
        hf, vllm, eager_rate = (statistics.median(rates[k]) for k in ("hf", "vllm", "eager"))
        gap_T = torch.cat(gaps).abs()
        print(
            f"| {agent.name} | {hf:.0f} | {vllm:.0f} | {eager_rate:.0f} | {vllm / hf:.2f} "
            f"| {eager_rate / hf:.2f} | {starts[False]:.0f} s | {starts[True]:.0f} s "
            f"| {statistics.median(syncs):.2f} s | {float(gap_T.mean()):.2e} | {float(gap_T.max()):.2e} |",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
