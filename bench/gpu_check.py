"""`make gpu-check`: every GPU check in one run, into one report (one H200-class GPU, no network).

Status: run twice on an H200 (docs/gpu.md, The first and the second GPU run); the update's memory and time
were measured at 512 new tokens, the compiled decode was not reached yet.

    python bench/gpu_check.py [--out results/gpu_check] [--skip-tests] [--steps 2] [--max-new-tokens N]
                              [--tiny --device cpu]

1. Preflight: CUDA, the GPU, torch / transformers / peft / bitsandbytes / pytest / workbench imports. Without
   CUDA it stops at once (exit 2) and says what to install (unless ``--device cpu``).
2. The ``gpu``-marked tests (not with ``--device cpu``): the CUDA variants of ``tests/test_gpu.py`` (HACPO
   steps with 4-bit QLoRA and with full fine-tuning, agents on CUDA and CPU together, Ray placing two agents
   on one GPU), ``test_agents.py`` and ``test_precision.py``.
3. A 1.7B-shaped agent: a Qwen3-1.7B config (`workbench.agents.plan.shapes.REFERENCE_CONFIGS`) with random
   bf16 weights built on the machine and a byte-level tokenizer padded to its 151,936 ids (nothing
   downloaded), with the recipe's 4-bit QLoRA (r 32 on every projection, gradient checkpointing), paired with
   a 2-layer random Qwen3 of 8,192 ids and a 4,096-token context (the zoo's tiny agents hold 256 tokens, less
   than the 1,024 new ones); 2 HACPO steps (``--steps``) of 16 prompts x G 8 at 1,024 new tokens
   (``--max-new-tokens``; random weights never stop early, so every row runs to the cap) under a
   length-parity reward (half the responses earn it, so the update runs; a math reward is always 0 for
   random weights). Per step: generated tokens/s, phase times,
   and the peak GPU memory of each agent's rollout and update next to the memory plan's prediction
   (`workbench.train.plan`). The report is rewritten after every step, so a time limit keeps what finished.
4. The decode step eager vs compiled (``train.compile_decode``: CUDA graphs): tokens/s, compile time, and
   the share of greedy tokens that agree (bf16 kernels may differ in the last bits).
5. The vLLM engine (``train.engine: vllm``; needs ``.venv-engine``, ``make engine``: without it the part says
   so and is skipped): the 1.7B-shaped 4-bit agent served from its dequantized base, greedy at the decode
   comparison's size and at 256 rows x 1,024 new tokens, tokens/s, the server's start-up, one policy sync, the
   GPU memory the server took against the plan's `engine_bytes`, and the sampler/trainer log-prob gap.

Everything goes to ``<out>/report.md`` (and ``report.json``); the exit code is 0 only when every part ran and
passed. ``--tiny --device cpu`` runs the same code at toy sizes on a CPU: a check of the script, not of a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the GPU machine: fail fast, never hang

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REQUIRED = ("torch", "transformers", "peft", "bitsandbytes", "yaml", "pandas", "math_verify", "tqdm")
TINY_QWEN3 = {
    "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "vocab_size": 8192,
    "tie_word_embeddings": True, "max_position_embeddings": 4096,
}  # fmt: skip
SIZES = {
    "full": {"prompts_per_step": 16, "group_size": 8, "minibatch_prompts": 8, "micro_batch_size": 8,
             "max_new_tokens": 1024, "decode_rows": 64, "decode_tokens": 128, "engine_rows": 256,
             "engine_tokens": 1024, "engine_kv_gib": 16},
    "tiny": {"prompts_per_step": 2, "group_size": 2, "minibatch_prompts": 1, "micro_batch_size": 2,
             "max_new_tokens": 8, "decode_rows": 4, "decode_tokens": 8, "engine_rows": 8, "engine_tokens": 8,
             "engine_kv_gib": 1},
}  # fmt: skip


def length_parity(completion: str, answer: str) -> float:
    """The stand-in's reward: random weights never answer correctly, so a math reward is always 0, every group
    is uniform and no update runs; half the responses earn this one, so the update's time and memory count."""
    return float(len(completion) % 2 == 0)


def preflight(device: str) -> tuple[dict, list[str]]:
    """Versions and the GPU; problems that make the check meaningless are returned as messages."""
    info, problems = {"python": sys.version.split()[0]}, []
    for name in (*REQUIRED, "pytest", "ray"):
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "installed")
        except Exception as exc:  # any import failure is a finding, not a crash
            info[name] = f"MISSING ({type(exc).__name__}: {exc})"
            if name in REQUIRED:
                problems.append(f"{name} cannot be imported: {exc}")
    import torch

    info["torch_cuda"] = torch.version.cuda
    if device == "cpu":
        return info, problems
    if not torch.cuda.is_available():
        problems.insert(
            0,
            f"torch {torch.__version__} sees no CUDA device (torch.version.cuda = {torch.version.cuda}); "
            "install a CUDA build of torch (docs/gpu.md) and run on a GPU machine",
        )
        return info, problems
    props = torch.cuda.get_device_properties(0)
    info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} device(s)"
    try:
        import bitsandbytes as bnb

        layer = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
        assert layer(torch.randn(2, 64, device="cuda", dtype=torch.bfloat16)).shape == (2, 64)
        info["bitsandbytes_cuda"] = "4-bit matmul OK"
    except Exception as exc:
        problems.append(f"bitsandbytes 4-bit on CUDA fails: {type(exc).__name__}: {exc}")
    return info, problems


def run_gpu_tests(timeout_s: int) -> dict:
    """The gpu-marked tests in a subprocess; returns the outcome and the tail of the output."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
           "tests/test_gpu.py", "tests/test_agents.py", "tests/test_precision.py"]  # fmt: skip
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        out, ok = proc.stdout + proc.stderr, proc.returncode == 0
    except subprocess.TimeoutExpired as exc:
        out, ok = f"TIMEOUT after {timeout_s} s\n{exc.stdout or ''}", False
    return {"ok": ok, "seconds": round(time.perf_counter() - start, 1), "tail": out[-4000:]}


def build_standin(config: dict, out_dir: Path, device: str) -> Path:
    """A random-weight model of ``config`` (bf16 on CUDA) with a byte-level tokenizer padded to its
    vocabulary, saved where ``from_pretrained`` reads it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from workbench.agents.models.tiny_tokenizers import bpe_tokenizer
    from workbench.config.agent_spec import DEFAULT_PROMPT_TEMPLATE

    trained = json.loads(bpe_tokenizer(400, DEFAULT_PROMPT_TEMPLATE).to_str())["model"]
    vocab = dict(trained["vocab"])
    # Ids the BPE never produces, so that every id the random model samples decodes to some text.
    vocab |= {f"<x{i}>": i for i in range(len(vocab), config["vocab_size"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in trained["merges"]]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    ids = {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    data = dict(config)
    model_config = AutoConfig.for_model(data.pop("model_type"), **data, **ids)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del model
    return out_dir


class PhasePeaks:
    """Wraps each worker's ``rollout`` and ``update`` to record the peak GPU memory of each call."""

    def __init__(self, trainer, on_gpu: bool) -> None:
        import torch

        self.peaks: dict[str, int] = {}
        for worker in trainer.executor.workers:
            for phase in ("rollout", "update"):
                method = getattr(worker, phase)

                def timed(*args, _method=method, _key=f"{worker.agent.name}/{phase}", **kwargs):
                    if on_gpu:
                        torch.cuda.reset_peak_memory_stats()
                    result = _method(*args, **kwargs)
                    if on_gpu:
                        self.peaks[_key] = max(self.peaks.get(_key, 0), torch.cuda.max_memory_allocated())
                    return result

                setattr(worker, phase, timed)


def standin_run(
    size: str, device: str, work: Path, result: dict, save: Callable[[], object], overrides: dict
) -> None:
    """HACPO steps of the 1.7B-shaped agent + a tiny partner, beside the memory plan's prediction, then the
    decode comparison; fills ``result`` as it goes and calls ``save`` after every step (a run cut short by a
    time limit keeps the steps it finished; the compile comes last). ``overrides`` replace train keys."""
    import torch

    from workbench.agents.plan.shapes import REFERENCE_CONFIGS
    from workbench.config.experiment import from_dict
    from workbench.train.rundir import RunWriter, create_run_dir
    from workbench.train.trainer import start_trainer

    s, on_gpu = SIZES[size], device.startswith("cuda")
    config = TINY_QWEN3 if size == "tiny" else REFERENCE_CONFIGS["Qwen/Qwen3-1.7B-Base"]
    t0 = time.perf_counter()
    model_dir = build_standin(config, work / "qwen3-1.7b-standin", device)
    partner_dir = build_standin(TINY_QWEN3, work / "qwen3-tiny-partner", device)
    build_s = time.perf_counter() - t0
    qlora = {"quantization": "4bit", "gradient_checkpointing": True, "device": device,
             "lora": {"r": 32, "alpha": 64, "target_modules": "all-linear"}}  # fmt: skip
    agents = [{"name": "qwen3-1.7b-shape", "model": str(model_dir), **qlora},
              {"name": "qwen3-tiny", "model": str(partner_dir), **qlora, "lora": {"r": 8}}]  # fmt: skip
    train = {k: v for k, v in s.items() if not k.startswith(("decode", "engine"))} | overrides
    cfg = from_dict(
        {
            "experiment": "gpu_check",
            "agents": agents,
            "task": {
                "source": "embedded",
                "train_size": 200,
                "eval_size": 0,
                "reward": "bench.gpu_check:length_parity",  # a custom reward (workbench.tasks.rewards)
            },
            "train": {"lr": 1e-5, "eval_every": 0, "kl_coef": 0.0, **train},
            "output": {"root": str(work / "runs")},
        }
    )
    run_dir = create_run_dir(cfg.output.root, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    t0 = time.perf_counter()
    trainer = start_trainer(cfg, run_dir)
    load_s = time.perf_counter() - t0
    peaks = PhasePeaks(trainer, on_gpu)
    plan, rows, before = trainer.memory_plan, [], dict.fromkeys(trainer.names, 0.0)
    predicted = {
        f"{a.name}/{phase}": a.phases[key] + plan.devices[a.facts.device]["resident"]
        for a in plan.agents
        for phase, key in (("rollout", "generate"), ("update", "update"))
    }
    result |= {
        "device": device, "build_s": round(build_s, 1), "load_s": round(load_s, 1), "steps": rows,
        "phase_peaks": peaks.peaks, "predicted": predicted, "train": train,
        "plan_peak": plan.devices[plan.agents[0].facts.device]["peak"],
        "rollout_rows": {a.name: a.rollout_rows for a in plan.agents},
    }  # fmt: skip
    for _ in range(cfg.train.steps):
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        metrics = trainer.train_step()
        tokens = sum(metrics[f"cost/{n}/generated_tokens"] - before[n] for n in trainer.names)
        before = {n: metrics[f"cost/{n}/generated_tokens"] for n in trainer.names}
        rows.append(
            {
                "step": trainer.step,
                "generated_tokens": tokens,
                "tokens_per_s": round(tokens / max(metrics["time/generate_s"], 1e-9), 1),
                **{k.removeprefix("time/"): round(v, 2) for k, v in metrics.items() if k.startswith("time/")},
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_gpu else None,
                **{f"loss/{n}": round(metrics[f"loss/{n}"], 4) for n in trainer.names},
            }
        )
        result["ok"] = len(rows) == cfg.train.steps
        print(f"step {trainer.step}: {rows[-1]}", flush=True)
        save()
    agent = trainer.executor.workers[0].agent
    result["decode"] = decode_speed(agent, s["decode_rows"], s["decode_tokens"])
    save()
    result["engine"] = engine_speed(agent, s, config)
    trainer.close()


def engine_speed(agent, s: dict, config: dict) -> dict:
    """The agent served by vLLM (its own environment): start-up, greedy tokens/s at the decode comparison's
    size and at ``engine_rows`` x ``engine_tokens``, one sync, the server's GPU memory against the plan, and
    the sampler/trainer log-prob gap."""
    import torch

    from workbench.agents.generation.vllm_engine import EngineError, VLLMEngine, engine_python
    from workbench.agents.plan.memory import engine_bytes
    from workbench.agents.plan.shapes import Inventory
    from workbench.train.batches import UpdateSettings
    from workbench.train.scoring import sampler_log_ratios, score_own

    try:
        python = engine_python()
    except EngineError as exc:
        return {"skipped": str(exc).splitlines()[0]}
    on_gpu = agent.device.type == "cuda"
    used = (lambda: (lambda free, total: total - free)(*torch.cuda.mem_get_info())) if on_gpu else (lambda: 0)
    kv = int(s["engine_kv_gib"] * 2**30)
    before, t0 = used(), time.perf_counter()
    # on CPU the part checks the script: an eager server starts in a third of the time
    engine = VLLMEngine(agent, python, kv_cache_bytes=kv, enforce_eager=not on_gpu).start()
    result = {"start_s": round(time.perf_counter() - t0, 1)}
    try:
        result["server_gib"] = round((used() - before) / 2**30, 2) if on_gpu else None
        result["planned_gib"] = round(
            engine_bytes(Inventory.from_config(config), agent.device.type, kv) / 2**30, 2
        )
        greedy = dict(temperature=0.0, top_p=1.0, author=0, seed=0)
        for key, rows, tokens in (("decode_size", s["decode_rows"], s["decode_tokens"]),
                                  ("engine_size", s["engine_rows"], s["engine_tokens"])):  # fmt: skip
            prompts = [f"{i} + {i + 1} =" for i in range(rows)]
            start = time.perf_counter()
            out = engine.generate(prompts, 1, max_new_tokens=tokens, **greedy)
            seconds = time.perf_counter() - start
            result[f"{key}_rows_x_tokens"] = f"{rows} x {tokens}"
            result[f"{key}_tok_s"] = round(sum(r.length for r in out) / seconds, 1)
        sampled = engine.generate(
            [f"{i} * 3 =" for i in range(s["decode_rows"])], 1, temperature=1.0, top_p=1.0,
            max_new_tokens=s["decode_tokens"], author=0, seed=1,
        )  # fmt: skip
        scores = score_own(agent, sampled, UpdateSettings(temperature=1.0, micro_batch_size=8))
        gap_T = torch.cat(sampler_log_ratios(sampled, scores)).abs()
        result |= {"gap_mean": float(gap_T.mean()), "gap_max": float(gap_T.max())}
        engine.sync()
        result["sync_s"] = round(engine.sync_seconds, 2)
    finally:
        engine.close()
    return result


def decode_speed(agent, rows: int, tokens: int) -> dict:
    """Greedy decode of ``rows`` x ``tokens``, eager then compiled (first call compiles); tokens/s of each."""
    from workbench.agents.generation.rollout import generate

    prompts = [f"{i} + {i + 1} =" for i in range(rows)]
    result = {}
    outputs = {}
    for name, compiled in (("eager", False), ("compile_first_call", True), ("compiled", True)):
        start = time.perf_counter()
        out = generate(agent, prompts, temperature=0.0, max_new_tokens=tokens, compile_decode=compiled)
        seconds = time.perf_counter() - start
        result[f"{name}_s"] = round(seconds, 2)
        result[f"{name}_tok_s"] = round(sum(r.length for r in out) / seconds, 1)
        outputs[name] = [t for r in out for t in r.response_ids]
    same = sum(a == b for a, b in zip(outputs["eager"], outputs["compiled"]))
    result["greedy_tokens_equal"] = f"{same}/{len(outputs['eager'])}"
    return result


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _table(rows: list[dict]) -> list[str]:
    keys = list(rows[0])
    return ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)] + [
        "| " + " | ".join(_cell(row[k]) for k in keys) + " |" for row in rows
    ]


def write_report(out: Path, report: dict) -> Path:
    """``report.json`` and a readable ``report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    on_gpu = report["device"].startswith("cuda")
    verdict = ("PASS" if report["ok"] else "FAIL") if on_gpu else ("script OK" if report["ok"] else "FAIL")
    lines = [
        f"# gpu-check ({report['when']}, {report['seconds']:.0f} s, {report['device']}): {verdict}",
        "",
        "A run on a GPU: the figures below are measurements of this machine."
        if on_gpu
        else "A CPU run of the script (`--device cpu`): nothing here was measured on a GPU.",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in report["preflight"].items()]
    lines += ["", "## Problems", *([f"- {p}" for p in report["problems"]] or ["- none"])]
    if tests := report.get("tests"):
        lines += ["", f"## gpu-marked tests: {'passed' if tests['ok'] else 'FAILED'} ({tests['seconds']} s)",
                  "```", tests["tail"].strip()[-2000:], "```"]  # fmt: skip
    if run := report.get("standin"):
        lines += [
            "",
            "## 1.7B-shaped agent (random Qwen3-1.7B, 4-bit QLoRA) + a 2-layer random Qwen3, "
            f"{len(run['steps'])} HACPO steps at {run['train']['max_new_tokens']} new tokens",
        ]
        if "error" in run:
            lines += ["```", run["error"], "```"]
        else:
            lines += [
                f"built in {run['build_s']} s, agents loaded in {run['load_s']} s; rollout rows planned "
                f"{run['rollout_rows']}",
                "",
                *_table(run["steps"]),
                "",
                "| agent/phase | peak GPU memory | planned (resident + phase) |",
                "|---|---|---|",
            ]
            for key, planned in run["predicted"].items():
                measured = run["phase_peaks"].get(key)
                shown = f"{measured / 2**30:.2f} GiB" if measured else "—"
                lines.append(f"| {key} | {shown} | {planned / 2**30:.2f} GiB |")
            lines += ["", f"planned device peak: {run['plan_peak'] / 2**30:.2f} GiB"]
            if "decode" in run:
                lines += ["", "## Decode step, eager vs compiled (greedy)", "", *_table([run["decode"]])]
            if "engine" in run:
                lines += ["", "## vLLM engine (the same agent, dequantized base + adapters)", "",
                          *_table([run["engine"]])]  # fmt: skip
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--test-timeout", type=int, default=180)
    parser.add_argument("--device", default="cuda", help="cpu: check this script itself on a CPU machine")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a 2-layer Qwen3, 8 new tokens)")
    parser.add_argument("--steps", type=int, default=2, help="HACPO steps of the 1.7B-shaped agent")
    parser.add_argument("--max-new-tokens", type=int, help="instead of the size's (1,024 for the full size)")
    args = parser.parse_args()
    start = time.perf_counter()
    info, problems = preflight(args.device)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device, "preflight": info,
              "problems": problems}  # fmt: skip
    print("\n".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    if problems and "CUDA" in problems[0]:
        report |= {"ok": False, "seconds": time.perf_counter() - start}
        print(f"\nFAIL: {problems[0]}\nreport: {write_report(args.out, report)}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        report["preflight"]["gpu-marked tests"] = "not run: --device cpu (they need CUDA)"
    elif not args.skip_tests:
        report["tests"] = run_gpu_tests(args.test_timeout)
        print(f"gpu tests: {'passed' if report['tests']['ok'] else 'FAILED'}", flush=True)
    report["standin"] = {"ok": False}

    def save() -> Path:
        return write_report(args.out, report | {"ok": False, "seconds": time.perf_counter() - start})

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        try:
            overrides = {"steps": args.steps} | (
                {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}
            )
            standin_run(
                "tiny" if args.tiny else "full", args.device, Path(work), report["standin"], save, overrides
            )
        except Exception as exc:
            report["standin"] |= {"ok": False, "error": "".join(traceback.format_exception(exc))[-3000:]}
    if args.skip_tests:
        problems.append("--skip-tests: the gpu-marked tests did not run")
    tests_ok = report["tests"]["ok"] if "tests" in report else args.device == "cpu"
    report |= {
        "ok": not problems and tests_ok and report["standin"]["ok"],
        "seconds": time.perf_counter() - start,
    }
    path = write_report(args.out, report)
    print(path.read_text())
    print(f"report: {path}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
