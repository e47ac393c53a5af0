"""Agent throughput on this machine: rollouts, scoring forward/backward, memory and FLOP/s utilization.

For a tiny agent (``tiny:llama-bpe``: Llama layers, which 4-bit quantizes) and the embedded SmolLM2-135M it
prints:

- rollout tokens/s of `workbench.agents.rollout.generate` at batch 64 vs plain ``model.generate`` on the same
batch
  (same prompts, left padding, KV cache, temperature 1, same response cap) and their ratio;
- scoring forward+backward throughput (`sequence_logprobs` + ``backward``) for full fine-tuning in fp32, LoRA
  and 4-bit LoRA, with each configuration's weight memory (``get_memory_footprint``) and the process's peak
  resident memory (loading included; every configuration runs in its own process, so peaks do not mix);
- achieved FLOP/s as a fraction of this machine's measured fp32 matmul peak. FLOPs are estimated as
  2·N per token for a forward pass, 6·N for forward+backward with weight gradients (full fine-tuning) and
  4·N with LoRA/4-bit (input gradients only; adapters are negligible), N = non-embedding parameters.

    .venv/bin/python bench/bench_agents.py [--skip-smollm2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {"tiny": "tiny:llama-bpe", "smollm2": "smollm2-135m-instruct"}
SCORE_BATCH = {"tiny": 64, "smollm2": 8}
NEW_TOKENS = {"tiny": 48, "smollm2": 32}
MODES = {"fp32": {}, "lora": {"lora": {"r": 16}}, "4bit-lora": {"lora": {"r": 16}, "quantization": "4bit"}}


def _prompts(which: str, n: int) -> list[str]:
    from workbench.tasks.arithmetic import embedded_task
    from workbench.tasks.prompts import build_prompt

    instruction = None if which == "tiny" else "Answer with the number only."
    return [build_prompt(item.question, instruction) for item in embedded_task("test", n, seed=1)]


def _non_embedding_params(model) -> int:
    skip = {id(p) for m in model.modules() if "Embedding" in type(m).__name__ for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def _hf_generate(agent, prompts: list[str], new_tokens: int) -> int:
    """Plain ``model.generate`` on the same left-padded batch; returns generated tokens (up to EOS)."""
    import torch

    tok = agent.tokenizer
    tok.padding_side = "left"
    texts = [agent.format_prompt(p) for p in prompts]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=not agent.uses_chat_template)
    with torch.no_grad():
        out = agent.model.generate(
            **batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
            pad_token_id=agent.pad_token_id, eos_token_id=list(agent.stop_token_ids),
        )  # fmt: skip
    new_B_T = out[:, batch["input_ids"].shape[1] :]
    total = 0
    for row in new_B_T.tolist():
        stops = [i for i, t in enumerate(row) if t in agent.stop_token_ids]
        total += stops[0] + 1 if stops else len(row)
    return total


def worker_rollout(which: str, repeats: int) -> dict:
    """Median tokens/s of our generate vs model.generate at batch 64."""
    import torch

    from workbench.agents.loading import load_agent
    from workbench.agents.rollout import generate

    agent = load_agent(MODELS[which])
    prompts, cap = _prompts(which, 64), NEW_TOKENS[which]
    ours, theirs = [], []
    for rep in range(repeats):
        torch.manual_seed(rep)
        start = time.perf_counter()
        tokens = sum(r.length for r in generate(agent, prompts, n=1, temperature=1.0, max_new_tokens=cap))
        ours.append(tokens / (time.perf_counter() - start))
        torch.manual_seed(rep)
        start = time.perf_counter()
        tokens = _hf_generate(agent, prompts, cap)
        theirs.append(tokens / (time.perf_counter() - start))
    n = _non_embedding_params(agent.model)
    return {"ours_tok_s": statistics.median(ours), "hf_tok_s": statistics.median(theirs), "params": n}


def worker_score(which: str, mode: str, repeats: int) -> dict:
    """Median tokens/s of sequence_logprobs forward+backward, and this process's peak RSS."""
    from workbench.agents.loading import load_agent
    from workbench.agents.rollout import generate, score_rollouts, sequence_logprobs
    from workbench.agents.sharing import build_training_batch

    agent = load_agent({"model": MODELS[which], **MODES[mode]})
    rollouts = generate(
        agent, _prompts(which, SCORE_BATCH[which]), n=1, seed=0, max_new_tokens=NEW_TOKENS[which]
    )
    score_rollouts(agent, rollouts)
    batch, _ = build_training_batch(agent, rollouts, learner_index=0)
    tokens = int(batch.attention_mask_B_T.sum())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        agent.model.zero_grad(set_to_none=True)
        (-sequence_logprobs(agent, batch).mean()).backward()
        times.append(time.perf_counter() - start)
    per_token = 6 if mode == "fp32" else 4
    return {
        "tok_s": tokens / statistics.median(times),
        "flops": per_token * _non_embedding_params(agent.model) * tokens / statistics.median(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "weights_mb": agent.model.get_memory_footprint() / 2**20,
        "batch": f"{len(batch)} x {batch.input_ids_B_T.shape[1]}",
    }


def worker_peak() -> dict:
    """The machine's fp32 matmul peak (median of a 2048^3 matmul), FLOP/s."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return {"flops": 2 * 2048**3 / statistics.median(times)}


def _run(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, check=False
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        fn = {"rollout": worker_rollout, "score": worker_score, "peak": worker_peak}[kind]
        print(json.dumps(fn(*rest, args.repeats) if kind != "peak" else fn()), flush=True)
        return
    peak = _run("peak")["flops"]
    print(f"machine fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s ({os.cpu_count()} cores)\n")
    models = ["tiny"] if args.skip_smollm2 else ["tiny", "smollm2"]
    print(f"{'model':8} {'generate tok/s':>15} {'model.generate':>15} {'ratio':>6} {'util':>6}")
    for which in models:
        r = _run("rollout", which)
        util = 2 * r["params"] * r["ours_tok_s"] / peak
        ratio = r["ours_tok_s"] / r["hf_tok_s"]
        print(f"{which:8} {r['ours_tok_s']:15.0f} {r['hf_tok_s']:15.0f} {ratio:6.2f} {util:6.1%}", flush=True)
    header = ["batch".rjust(9), "fwd+bwd tok/s".rjust(14), "weights MB".rjust(11), "peak RSS MB".rjust(12)]
    print(f"\n{'model':8} {'mode':10} {' '.join(header)} {'util':>6}")
    for which in models:
        for mode in MODES:
            r = _run("score", which, mode)
            print(
                f"{which:8} {mode:10} {r['batch']:>9} {r['tok_s']:14.0f} {r['weights_mb']:11.1f} "
                f"{r['peak_rss_mb']:12.0f} {r['flops'] / peak:6.1%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
