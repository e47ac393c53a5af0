"""TRL's side of `bench_peers.py`: ``GRPOTrainer`` in GSPO mode on the spec the workbench side wrote.

Runs in the bench-only environment (``make bench-peers`` → ``.venv-bench/``, TRL next to the workbench's torch
and transformers pins); imports nothing from the workbench. Reads a JSON spec (model directory, prompts of
every round in order, answers, sizes, optimizer settings), trains ``rounds`` generation rounds of
``updates_per_round`` optimizer steps each, and prints one JSON line: per round the wall time, the time of
TRL's ``_generate`` (sampling only) and ``_generate_and_score_completions`` (sampling + reward + old log-probs
+ advantages), the generated tokens, and the process's peak RSS.

    .venv-bench/bin/python bench/peers_trl.py SPEC.json
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """1 when the last number of the completion equals the answer (the embedded task's integers)."""
    out = []
    for text, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", text)
        out.append(float(bool(numbers) and numbers[-1] == gold))
    return out


def main() -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.manual_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in zip(spec["prompts"], spec["answers"])])
    per_update = spec["sequences_per_update"]
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=per_update,
            gradient_accumulation_steps=1,
            steps_per_generation=spec["updates_per_round"],
            num_generations=spec["group_size"],
            max_completion_length=spec["max_new_tokens"],
            temperature=spec["temperature"],
            top_p=spec["top_p"],
            learning_rate=spec["lr"],
            lr_scheduler_type="constant",
            weight_decay=spec["weight_decay"],
            max_grad_norm=spec["grad_clip"],
            beta=0.0,
            epsilon=spec["eps_low"],
            epsilon_high=spec["eps_high"],
            importance_sampling_level="sequence",
            loss_type="grpo",
            disable_dropout=True,
            shuffle_dataset=False,
            max_steps=spec["rounds"] * spec["updates_per_round"],
            logging_steps=10_000,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            seed=spec["seed"],
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=_reward, args=args, train_dataset=data, processing_class=tokenizer
        )
        rounds: list[dict[str, float]] = []
        timers = {"generate": 0.0, "generate_and_score": 0.0, "tokens": 0.0}

        def timed(name: str, fn):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                out = fn(*a, **k)
                timers[name] += time.perf_counter() - t0
                if name == "generate_and_score":
                    timers["tokens"] += float(out["completion_mask"].sum())
                return out

            return wrapper

        trainer._generate = timed("generate", trainer._generate)
        trainer._generate_and_score_completions = timed(
            "generate_and_score", trainer._generate_and_score_completions
        )

        def cpu_s() -> float:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return usage.ru_utime + usage.ru_stime

        class Rounds(TrainerCallback):
            def __init__(self) -> None:
                self.start, self.cpu = time.perf_counter(), cpu_s()

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % spec["updates_per_round"] == 0:
                    now, cpu = time.perf_counter(), cpu_s()
                    rounds.append({"step_s": now - self.start, "cpu_s": cpu - self.cpu, **timers})
                    timers.update(generate=0.0, generate_and_score=0.0, tokens=0.0)
                    self.start, self.cpu = now, cpu

        trainer.add_callback(Rounds())
        trainer.train()
    print(
        json.dumps(
            {
                "rounds": rounds,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "versions": {"trl": __import__("trl").__version__, "torch": torch.__version__},
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
