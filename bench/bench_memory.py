"""Benchmark: the memory plan's predicted peak against the peak RSS measured on CPU, one process per case.

Each case trains a few steps in a fresh subprocess (``--child``) that reports its own peak resident set
(``VmHWM`` of ``/proc/self/status``; the math-verify grader's worker processes are separate and not counted);
the prediction is `workbench.train.plan.plan_experiment` of the same config on ``cpu`` with this machine's
RAM, from the model configs alone. ``baseline`` is a process that imported the training stack and ran one
step of a one-layer model: the runtime constant the plan adds on CPU
(`workbench.agents.plan.memory.CPU_RUNTIME_BYTES`).

    .venv/bin/python bench/bench_memory.py [--cases quickstart smollm2-lora smollm2-4bit] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
SMOL = {
    "name": "smollm2",
    "model": "smollm2-135m-instruct",
    "lora": {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
}
SMOL_TRAIN = {
    "prompts_per_step": 4, "group_size": 4, "minibatch_prompts": 2, "micro_batch_size": 16,
    "max_new_tokens": 64, "eval_every": 0, "save_every": 100, "kl_coef": 0.0,
}  # fmt: skip
CASES = {
    "baseline": None,
    "quickstart": ("experiments/quickstart.yaml", {}),
    "smollm2-lora": (None, {"agents": [SMOL], "train": SMOL_TRAIN}),
    "smollm2-4bit": (None, {"agents": [SMOL | {"quantization": "4bit"}], "train": SMOL_TRAIN}),
    "smollm2-lora-mb2": (None, {"agents": [SMOL], "train": SMOL_TRAIN | {"micro_batch_size": 2}}),
    "smollm2-4bit-mb2": (
        None,
        {"agents": [SMOL | {"quantization": "4bit"}], "train": SMOL_TRAIN | {"micro_batch_size": 2}},
    ),
}
"""name -> (experiment YAML or None, changes); SmolLM2 cases: 4 prompts x G 4, 64 new tokens, no eval, 16
sequences per micro-batch (activations dominate) or 2 (the weights and, for 4-bit, the load dominate)."""


def _config(case: str, steps: int, root: str):
    from workbench.config.experiment import from_dict
    from workbench.config.loading import load_experiment

    path, changes = CASES[case]
    if path:
        cfg = load_experiment(ROOT / path, {"train.steps": steps, "output.root": root})
        return cfg
    return from_dict(
        {
            "experiment": case,
            "algorithm": "gspo",
            "agents": changes["agents"],
            "task": {"source": "embedded", "train_size": 200, "eval_size": 0, "instruction": INSTRUCTION},
            "train": changes["train"] | {"steps": steps},
            "output": {"root": root},
        }
    )


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(case: str, steps: int) -> dict:
    """Runs in the subprocess: trains ``case`` and returns its peak RSS and times."""
    start = time.perf_counter()
    if case == "baseline":
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        import workbench.train.run  # noqa: F401  (the whole training stack, peft and bitsandbytes included)
        from workbench.tasks.rewards import grade_batch

        grade_batch(["\\boxed{3}", "\\boxed{x^2}"], ["3", "x^2"])  # the grader, as a step uses it

        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, vocab_size=64))  # fmt: skip
        model(input_ids=torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8))).loss.backward()
        return {"peak_rss": _peak_rss(), "seconds": time.perf_counter() - start}
    from workbench.train.run import train

    with tempfile.TemporaryDirectory() as root:
        train(_config(case, steps, root))
    return {"peak_rss": _peak_rss(), "seconds": time.perf_counter() - start}


def predict(case: str, steps: int) -> tuple[int, dict]:
    """The plan's CPU peak for ``case`` and its parts."""
    from workbench.tasks.prompts import build_prompt
    from workbench.tasks.sources import load_tasks
    from workbench.train.plan import facts_from_config, plan_experiment

    cfg = _config(case, steps, tempfile.gettempdir())
    items = load_tasks(cfg.task.source, split="train", n=64, seed=cfg.seed, **cfg.task.knobs)
    facts, _ = facts_from_config(
        cfg, [build_prompt(i.question, cfg.task.instruction) for i in items], device="cpu"
    )
    plan = plan_experiment(cfg, facts)
    parts = {
        a.name: {k: v for k, v in a.phases.items()} | {"resident": a.memory.resident} for a in plan.agents
    }
    return plan.devices["cpu"]["peak"], parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    rows = []
    for case in args.cases:
        load = os.getloadavg()[0]
        out = subprocess.run(
            [sys.executable, __file__, "--child", case, "--steps", str(args.steps)],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        predicted = predict(case, args.steps)[0] if case != "baseline" else None
        rows.append((case, measured, predicted, load))
        print(json.dumps({"case": case, **measured, "predicted": predicted, "load": load}), flush=True)
    print("\n| case | measured peak RSS | predicted | predicted / measured | wall | load average |")
    print("|---|---|---|---|---|---|")
    for case, measured, predicted, load in rows:
        ratio = f"{predicted / measured['peak_rss']:.2f}" if predicted else "—"
        pred = f"{predicted / 2**20:.0f} MiB" if predicted else "—"
        print(
            f"| {case} | {measured['peak_rss'] / 2**20:.0f} MiB | {pred} | {ratio} | "
            f"{measured['seconds']:.0f} s | {load:.1f} |"
        )


if __name__ == "__main__":
    main()
