"""Agent throughput on this machine: rollouts against the roofline, scoring forward/backward, memory.

For a tiny agent (``tiny:llama-bpe``: Llama layers, which 4-bit quantizes) and the embedded SmolLM2-135M:

1. Rollouts of `workbench.agents.generation.rollout.generate` at batch 64 (temperature 1), in two shapes: 64
   distinct prompts x 1 sample, and the trainer's 8 prompts x G 8. Prefill (`decode.prefill`) and decode
   (`decode._decode`) are timed apart. Generated tokens per second are set against the fp32 matmul peak of
   the decode shape (64x576 · 576x1536, SmolLM2's MLP at batch 64), measured in the same process between the
   repetitions: ``util`` = generated tokens x FLOPs per token / time / peak, FLOPs per token = 2 x (non-
   embedding parameters + LM head), so prefill time counts against it and prefill FLOPs do not. Plain
   ``model.generate`` on the same batch is the baseline of the ``vs HF`` column.
2. Scoring forward+backward throughput (`sequence_logprobs` + ``backward``) for full fine-tuning in fp32, LoRA
   and 4-bit LoRA, each in its own process, with the weights' memory (``get_memory_footprint``) and the peak
   RSS of each phase: loading, sampling + scoring, forward+backward (Linux: the peak is reset between phases
   through ``/proc/self/clear_refs``). FLOPs: 6·N per token with weight gradients, 4·N with LoRA/4-bit.

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
SHAPES = {"64x1": (64, 1), "8x8": (8, 8)}
"""Rollout batches of 64 rows: distinct prompts x samples per prompt."""
MODES = {"fp32": {}, "lora": {"lora": {"r": 16}}, "4bit-lora": {"lora": {"r": 16}, "quantization": "4bit"}}
DECODE_SHAPE = (64, 576, 1536)


def _prompts(which: str, n: int) -> list[str]:
    from workbench.tasks.arithmetic import embedded_task
    from workbench.tasks.prompts import build_prompt

    instruction = None if which == "tiny" else "Answer with the number only."
    return [build_prompt(item.question, instruction) for item in embedded_task("test", n, seed=1)]


def _non_embedding_params(model) -> int:
    skip = {id(p) for m in model.modules() if "Embedding" in type(m).__name__ for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def _flops_per_token(model) -> int:
    """2 x (non-embedding parameters + the LM head, tied or not): the matmul FLOPs of one token's forward."""
    return 2 * (_non_embedding_params(model) + model.get_output_embeddings().weight.numel())


def _matmul_peak(m: int, k: int, n: int, repeats: int = 9) -> float:
    """Median fp32 FLOP/s of an (m, k) x (k, n) matmul."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / statistics.median(times)


def _hf_generate(agent, prompts: list[str], n: int, new_tokens: int) -> int:
    """Plain ``model.generate`` on the same left-padded rows; returns generated tokens (up to EOS)."""
    import torch

    tok = agent.tokenizer
    tok.padding_side = "left"
    texts = [agent.format_prompt(p) for p in prompts for _ in range(n)]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=not agent.uses_chat_template)
    with torch.no_grad():
        out = agent.model.generate(
            **batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
            pad_token_id=agent.pad_token_id, eos_token_id=list(agent.stop_token_ids),
        )  # fmt: skip
    total = 0
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        stops = [i for i, t in enumerate(row) if t in agent.stop_token_ids]
        total += stops[0] + 1 if stops else len(row)
    return total


def worker_rollout(which: str, repeats: int) -> dict:
    """Per batch shape: medians of prefill/decode time, tokens/s, and the decode-shape peak between them."""
    from workbench.agents.generation import decode, rollout
    from workbench.agents.models.loading import load_agent

    agent = load_agent(MODELS[which])
    cap = NEW_TOKENS[which]
    phase = {"prefill": 0.0, "decode": 0.0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            phase[name] += time.perf_counter() - start
            return out

        return wrapper

    decode.prefill = timed("prefill", decode.prefill)  # the names `sample_rows` calls
    decode._decode = timed("decode", decode._decode)
    out: dict = {"flops_per_token": _flops_per_token(agent.model), "peaks": [], "shapes": {}}
    rollout.generate(agent, _prompts(which, 8), n=2, max_new_tokens=4, seed=0)  # warm-up
    for shape, (n_prompts, n) in SHAPES.items():
        prompts = _prompts(which, n_prompts)
        encoded = [agent.encode_prompt(p) for p in prompts]
        runs = []
        for rep in range(repeats):
            out["peaks"].append(_matmul_peak(*DECODE_SHAPE))
            phase.update(prefill=0.0, decode=0.0)
            start = time.perf_counter()
            results = rollout.generate(agent, prompts, n=n, temperature=1.0, max_new_tokens=cap, seed=rep)
            total = time.perf_counter() - start
            start = time.perf_counter()
            hf_tokens = _hf_generate(agent, prompts, n, cap)
            hf_total = time.perf_counter() - start
            runs.append(
                {
                    "tokens": sum(r.length for r in results),
                    "total": total,
                    **phase,
                    "hf_tok_s": hf_tokens / hf_total,
                }
            )
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        med["prompt_tokens"] = sum(len(p) for p in encoded) * n
        out["shapes"][shape] = med
    out["peaks"].append(_matmul_peak(*DECODE_SHAPE))
    out["peak_2048"] = _matmul_peak(2048, 2048, 2048, repeats=3)
    return out


def _rss_mb() -> tuple[float, float]:
    """(current, peak since the last reset) resident memory in MB, from /proc (ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return peak, peak


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def worker_score(which: str, mode: str, repeats: int) -> dict:
    """Median tokens/s of sequence_logprobs forward+backward, and the peak RSS of each phase."""
    _reset_peak()
    from workbench.agents.forward.passes import sequence_logprobs
    from workbench.agents.forward.sharing import build_training_batch
    from workbench.agents.generation.rollout import generate
    from workbench.agents.models.loading import load_agent
    from workbench.train.scoring import UpdateSettings, score_own

    agent = load_agent({"model": MODELS[which], **MODES[mode]})
    peaks = {"load": _rss_mb()[1]}
    _reset_peak()
    rollouts = generate(
        agent, _prompts(which, SCORE_BATCH[which]), n=1, seed=0, max_new_tokens=NEW_TOKENS[which]
    )
    score_own(agent, rollouts, UpdateSettings(micro_batch_size=32))
    peaks["sample+score"] = _rss_mb()[1]
    _reset_peak()
    batch, _ = build_training_batch(agent, rollouts, learner_index=0)
    tokens = int(batch.attention_mask_B_T.sum())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        agent.model.zero_grad(set_to_none=True)
        (-sequence_logprobs(agent, batch).mean()).backward()
        times.append(time.perf_counter() - start)
    peaks["fwd+bwd"] = _rss_mb()[1]
    per_token = 6 if mode == "fp32" else 4
    return {
        "tok_s": tokens / statistics.median(times),
        "flops": per_token * _non_embedding_params(agent.model) * tokens / statistics.median(times),
        "peaks": peaks,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "weights_mb": agent.model.get_memory_footprint() / 2**20,
        "batch": f"{len(batch)} x {batch.input_ids_B_T.shape[1]}",
    }


def _run(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, check=False
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _print_rollouts(which: str, r: dict) -> None:
    peak = statistics.median(r["peaks"])
    m, k, n = DECODE_SHAPE
    print(
        f"\n{which} ({MODELS[which]}, {r['flops_per_token'] / 1e9:.3f} GFLOP/token, {NEW_TOKENS[which]} new "
        f"tokens): decode-shape peak {m}x{k}·{k}x{n} {peak / 1e9:.1f} GFLOP/s in this run "
        f"(2048³: {r['peak_2048'] / 1e9:.1f})"
    )
    header = f"{'rows':<6}{'tokens':>7}{'prefill s':>10}{'decode s':>9}{'total s':>8}{'tok/s':>7}"
    print(header + f"{'decode tok/s':>13}{'util':>7}{'decode util':>12}{'prompt tok/s':>13}{'vs HF':>7}")
    for shape, s in r["shapes"].items():
        tok_s, decode_tok_s = s["tokens"] / s["total"], s["tokens"] / s["decode"]
        util = tok_s * r["flops_per_token"] / peak
        decode_util = decode_tok_s * r["flops_per_token"] / peak
        print(
            f"{shape:<6}{s['tokens']:>7.0f}{s['prefill']:>10.2f}{s['decode']:>9.2f}{s['total']:>8.2f}"
            f"{tok_s:>7.0f}{decode_tok_s:>13.0f}{util:>7.1%}{decode_util:>12.1%}"
            f"{s['prompt_tokens'] / s['prefill']:>13.0f}{tok_s / s['hf_tok_s']:>7.2f}",
            flush=True,
        )
    if which == "smollm2":
        util = statistics.median(
            s["tokens"] / s["total"] * r["flops_per_token"] / peak for s in r["shapes"].values()
        )
        print(f"goal SmolLM2 batch-64 rollout >= 40% of the decode-shape peak: {util:.1%} (median of shapes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        fn = {"rollout": worker_rollout, "score": worker_score}[kind]
        print(json.dumps(fn(*rest, args.repeats)), flush=True)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    models = ["tiny"] if args.skip_smollm2 else ["tiny", "smollm2"]
    peak = None
    for which in models:
        r = _run("rollout", which)
        peak = statistics.median(r["peaks"])
        _print_rollouts(which, r)
    header = ["batch".rjust(9), "fwd+bwd tok/s".rjust(14), "weights MB".rjust(11)]
    phases = ["load", "sample+score", "fwd+bwd"]
    print("\npeak RSS per phase (MB) and forward+backward throughput; util vs the decode-shape peak")
    print(
        f"{'model':8} {'mode':10} {' '.join(header)} " + " ".join(f"{p:>12}" for p in phases) + f"{'util':>7}"
    )
    for which in models:
        for mode in MODES:
            r = _run("score", which, mode)
            print(
                f"{which:8} {mode:10} {r['batch']:>9} {r['tok_s']:14.0f} {r['weights_mb']:11.1f} "
                + " ".join(f"{r['peaks'][p]:12.0f}" for p in phases)
                + f"{r['flops'] / peak:7.1%}",
                flush=True,
            )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
