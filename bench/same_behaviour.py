"""Does a change keep the training behaviour? The quickstart under every method, a few steps, logged values
and samples compared bit for bit between two checkouts.

    python bench/same_behaviour.py record OUT            # run every method here, keep what each run logged
    python bench/same_behaviour.py record OUT --methods hacpo,gspo   # a few of them
    python bench/same_behaviour.py compare BEFORE AFTER  # every logged value and sample, key by key

`record` trains `experiments/quickstart.yaml` for ``--steps`` steps (default 5) under each method of
`workbench.config.methods.METHODS` (the ablations as their label and switches), one torch thread and the
in-process executor (results are deterministic at a fixed thread count), with a 100-item held-out set
evaluated at the start and the end, and copies each run's ``metrics.jsonl`` (without ``time/``),
``evals.csv``, ``eval_items.csv`` and ``samples/`` under ``OUT/<method>/``. Run it from the checkout under
test (``cd`` there: ``python -m`` and this script import the package of the current directory). `compare`
lists every file, key or sample that differs (exit 1) or says they are identical (exit 0); a key present on
one side only is listed too (``--allow-new`` accepts keys that only AFTER logs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COPIED = ("metrics.jsonl", "evals.csv", "eval_items.csv")


def _methods() -> dict[str, list[str]]:
    """``{method: [--set overrides]}`` of every method in the table (read from the checkout run)."""
    sys.path.insert(0, os.getcwd())
    from workbench.config.methods import METHODS

    out = {}
    for name, method in METHODS.items():
        sets = [f"algorithm={method.algorithm}"]
        if not method.is_algorithm:
            sets.append(f"label={name}")
            sets += [f"hacpo.{key}={json.dumps(value)}" for key, value in method.switches.items()]
        out[name] = sets
    return out


def record(out: Path, steps: int, only: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    methods = _methods()
    unknown = [name for name in only if name not in methods]
    if unknown:
        sys.exit(f"--methods: {unknown} are not methods; valid: {sorted(methods)}")
    for name, sets in methods.items():
        if only and name not in only:
            continue
        root = out / "runs" / name
        common = [
            f"train.steps={steps}",
            f"train.eval_every={steps}",
            "task.eval_size=100",
            "executor=local",
            f"output.root={root}",
        ]
        cmd = [sys.executable, "-m", "workbench", "run", "experiments/quickstart.yaml", "--seeds", "0"]
        subprocess.run([*cmd, "--set", *sets, *common], check=True, env=env)
        (run_dir,) = [p.parent for p in root.rglob("DONE")]
        kept = out / name
        kept.mkdir(parents=True, exist_ok=True)
        for file in COPIED:
            if (run_dir / file).exists():
                shutil.copy(run_dir / file, kept / file)
        shutil.copytree(run_dir / "samples", kept / "samples", dirs_exist_ok=True)
        print(f"{name}: {run_dir}", flush=True)


def _metrics(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time/")} for r in rows}


def compare(before: Path, after: Path, allow_new: bool, only: list[str]) -> int:
    problems = []
    methods = sorted(p.name for p in before.iterdir() if p.is_dir() and p.name != "runs")
    methods = [name for name in methods if not only or name in only]
    for name in methods:
        a, b = before / name, after / name
        if not b.is_dir():
            problems.append(f"{name}: not recorded in {after}")
            continue
        ma, mb = _metrics(a / "metrics.jsonl"), _metrics(b / "metrics.jsonl")
        for step in sorted(set(ma) | set(mb)):
            ra, rb = ma.get(step, {}), mb.get(step, {})
            for key in sorted(set(ra) | set(rb)):
                if key not in ra and allow_new:
                    continue
                if ra.get(key, "absent") != rb.get(key, "absent"):
                    problems.append(
                        f"{name} step {step} {key}: {ra.get(key, 'absent')} vs {rb.get(key, 'absent')}"
                    )
        files = [
            *(f for f in COPIED[1:] if (a / f).exists()),
            *(f"samples/{p.name}" for p in (a / "samples").iterdir()),
        ]
        for file in sorted(files):
            if not (b / file).exists() or (a / file).read_bytes() != (b / file).read_bytes():
                problems.append(f"{name}: {file} differs")
    for line in problems:
        print(line)
    print(
        f"{len(methods)} methods compared: " + (f"{len(problems)} differences" if problems else "identical")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run every method here and keep what it logged")
    rec.add_argument("out", type=Path)
    rec.add_argument("--steps", type=int, default=5)
    rec.add_argument("--methods", default="", help="comma-separated methods (default: every method)")
    cmp_ = sub.add_parser("compare", help="compare two recordings")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--allow-new", action="store_true", help="accept keys only AFTER logs")
    cmp_.add_argument("--methods", default="", help="comma-separated methods (default: every one recorded)")
    args = parser.parse_args()
    only = [name for name in args.methods.split(",") if name]
    if args.command == "record":
        record(args.out.resolve(), args.steps, only)
    else:
        sys.exit(compare(args.before, args.after, args.allow_new, only))
