"""Command line: ``python -m workbench {run,plan,demo,reproduce,eval,export,summarize}``.

- ``run EXPERIMENT.yaml [--set key=value ...] [--seeds 0,1,2] [--dry-run]``: train one experiment, one run
  directory per seed (a matching unfinished run resumes); it first says where each run writes and whether it
  starts, resumes or is skipped, and ends with each run's held-out table; ``--dry-run`` checks it and prints
  the resolved config and those lines without loading a model. ``--set`` may come before the path too.
- ``plan EXPERIMENT.yaml [--device cuda|cpu] [--memory 80GiB]``: per agent the bytes of weights, adapters,
  optimizer state, KV cache, activations and logits, and the batch sizes the trainer will pick.
- ``demo [--seeds ...]``: the main job — the quickstart notebook (HACPO vs GSPO), then a table.
- ``reproduce [--smoke] [--only NAME ...] [--seeds ...]``: re-execute every benchmark/ablation notebook.
- ``eval TARGET``: a run's trained agents (or a model) on benchmarks and task sources: avg@k, pass@k, best@k.
- ``export RUN_DIR [--merged]``: each trained agent written with ``save_pretrained``.
- ``summarize [RESULTS_ROOT ...] [--out DIR] [--force] [--same-code V1,V2] [--check-against CSV]``: the
  results summary (tables with seeds) into ``RESULTS_ROOT/summary`` (a summary committed to git is
  replaced only with ``--force``), its comparison table printed, and, optionally, ``docs/results.md``;
  ``--check-against`` checks it, as a rerun, against a committed ``comparison.csv`` (each mean within 2
  standard errors) into ``rerun_check.csv``; ``--same-code`` pools the runs of the code versions it names.
- ``zoo list`` / ``zoo build [NAME ...] [--ship]``: the agents shipped in ``zoo/`` and their cards; rebuild
  one on this machine and see how far it lands from the shipped card.

Every bad input ends with exit code 2 and a paragraph naming the field, the value and what is allowed, found
before any model loads (`workbench.train.preflight`).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported by the commands that need it
    pass

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (2-core machines)

log = logging.getLogger("workbench")


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=logging.INFO if not verbose else logging.DEBUG, handlers=[handler])
    for noisy in ("httpx", "urllib3", "papermill", "filelock", "transformers", "traitlets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _seeds(text: str) -> tuple[int, ...]:
    """``--seeds 0,1,2`` → ``(0, 1, 2)``."""
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        seeds = ()
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: distinct integers >= 0, e.g. 0,1,2")
    return seeds


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.jobs.commands import run_command

    return run_command(args)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(GiB|GB|MiB|MB|G|M)?", re.IGNORECASE)
_UNITS = {"gib": 2**30, "g": 2**30, "gb": 10**9, "mib": 2**20, "m": 2**20, "mb": 10**6}


def _size(text: str) -> int:
    """``80GiB`` / ``80G`` → bytes (GiB, MiB; GB and MB are powers of ten; a bare number is GiB)."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a size such as 80GiB, 24GB or 512MiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "gib").lower()])


def _cmd_plan(args: argparse.Namespace) -> int:
    from workbench.config.checks import ConfigError
    from workbench.config.loading import load_experiment
    from workbench.core.env import project_path
    from workbench.tasks.prompts import build_prompt
    from workbench.tasks.sources import load_tasks
    from workbench.train.plan import facts_from_config, plan_experiment, render

    cfg = load_experiment(project_path(args.experiment), args.set)
    try:
        items = load_tasks(cfg.task.source, split="train", n=64, seed=cfg.seed, **cfg.task.knobs)
        prompts = [build_prompt(item.question, cfg.task.instruction) for item in items]
        where = f"the longest of 64 {cfg.task.source!r} training prompts"
    except (FileNotFoundError, ValueError) as exc:
        prompts = ["x" * args.prompt_chars]
        where = f"{args.prompt_chars} characters assumed ({cfg.task.source!r} is not readable here: {exc})"
    try:
        facts, notes = facts_from_config(cfg, prompts, device=args.device, memory=args.memory)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    log.info("%s\n", render(plan_experiment(cfg, facts), cfg))
    log.info("prompts: %s", where)
    for note in notes:
        log.info("- %s", note)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.jobs.runner import run_quickstart

    start = time.perf_counter()
    seeds = list(args.seeds or (0,))
    log.info("executing notebooks/01_quickstart.ipynb (HACPO and GSPO; builds the tiny agents on first use)")
    outputs = run_quickstart(smoke=args.smoke, seeds=seeds, progress=True)
    log.info("\n%s", outputs["text"].rstrip())
    if len(seeds) == 1:
        log.info(
            "\nOne seed (%d) is a smoke test, not a result: `python -m workbench demo --seeds 0,1,2` gives "
            "mean ± std over three.",
            seeds[0],
        )
    log.info("\nwrote:")
    for path in outputs["files"]:
        log.info("  %s", path)
    log.info("wall time: %.0f s", time.perf_counter() - start)
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from workbench.jobs.runner import reproduce

    index = reproduce(smoke=args.smoke, only=args.only or None, seeds=args.seeds, progress=True)
    log.info("index: %s", index)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from workbench.agents.forward.agent import AgentLoadError
    from workbench.config.checks import ConfigError
    from workbench.jobs.evaluation import evaluate_target
    from workbench.lab.stats import formatted

    try:
        report = evaluate_target(
            args.target,
            agents=args.agent,
            sources=args.source,
            n=args.n,
            k=args.k,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            reward=args.reward,
            metric=args.metric,
            seed=args.seed,
            out_dir=args.out,
        )
    except AgentLoadError as exc:
        raise ConfigError(str(exc)) from None
    log.info(
        "\n%s per agent and benchmark (Table-1 layout, one run each):\n%s",
        report.metric,
        formatted(report.table, with_se=True).to_string(),
    )
    log.info("\nwrote:")
    for path in report.files:
        log.info("  %s", path)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from workbench.agents.forward.agent import AgentLoadError
    from workbench.agents.models.export import export_run
    from workbench.agents.models.loading import is_run_dir
    from workbench.config.checks import ConfigError
    from workbench.core.env import project_path

    run_dir = project_path(args.run_dir)
    if not is_run_dir(run_dir):
        raise ConfigError(
            f"RUN_DIR = {args.run_dir!r} is not allowed: a run directory holding config.yaml and "
            "checkpoints/ (results/<experiment>/<run-id>)"
        )
    try:
        written = export_run(run_dir, args.out, agents=args.agent, merged=args.merged)
    except AgentLoadError as exc:
        raise ConfigError(str(exc)) from None
    for agent, folders in written.items():
        log.info("%s: %s", agent, ", ".join(str(f) for f in folders))
    return 0


def _cmd_summarize(args: argparse.Namespace) -> int:
    from workbench.jobs.commands import summarize_command

    return summarize_command(args)


def _cmd_zoo(args: argparse.Namespace) -> int:
    from workbench.agents.models.shipped import shipped_card
    from workbench.agents.models.warm import WARM_STARTS, rebuild_warm
    from workbench.agents.models.zoo import TINY_PRESETS, rebuild_tiny
    from workbench.config.checks import ConfigError

    known = [f"tiny:{n}" for n in TINY_PRESETS] + [f"warm:{n}" for n in WARM_STARTS]
    if args.action == "list":
        for agent in known:
            card = shipped_card(*agent.split(":")) or {}
            log.info(
                "%-24s greedy %-6s steps %-4s %s", agent, card.get("initial_greedy_accuracy", "—"),
                card.get("warm_steps", card.get("steps", "—")), card.get("description", "(not shipped)"),
            )  # fmt: skip
        return 0
    names = [n if ":" in n else f"tiny:{n}" for n in args.names] or [f"tiny:{n}" for n in TINY_PRESETS]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(f"NAME = {unknown[0]!r} is not allowed: one of {known}")
    for name in names:
        kind, preset = name.split(":")
        row = (rebuild_tiny if kind == "tiny" else rebuild_warm)(preset, ship_it=args.ship)
        log.info(
            "%s: rebuilt greedy %.3f vs shipped %s (Δ %s), weights %s, %.0f s -> %s",
            row["agent"], row["rebuilt_accuracy"], row["shipped_accuracy"], row["delta"],
            {True: "bit-identical", False: "differ", None: "not shipped"}[row["same_weights"]],
            row["build_seconds"], "shipped into zoo/" if args.ship else row["path"],
        )  # fmt: skip
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    seeds = {"type": _seeds, "metavar": "0,1,2", "help": "training seeds, one run directory each"}
    run = sub.add_parser("run", help="train one experiment YAML")
    run.add_argument(
        "experiment", nargs="?", help="path of an experiment YAML, e.g. experiments/quickstart.yaml"
    )
    run.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="overrides (several pairs), before or after the YAML path",
    )
    run.add_argument("--seeds", **seeds)
    run.add_argument("--fresh", action="store_true", help="start a new run even if a matching one exists")
    run.add_argument(
        "--reuse-other-code", action="store_true", help="resume or reuse a matching run made by other code"
    )
    run.add_argument(
        "--dry-run", action="store_true", help="check and print the resolved config; no training"
    )
    run.set_defaults(func=_cmd_run)
    plan = sub.add_parser("plan", help="memory and time plan of an experiment (no weights are loaded)")
    plan.add_argument("experiment", help="path of an experiment YAML")
    plan.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="overrides")
    plan.add_argument("--device", choices=["cuda", "cpu"], help="plan every agent on this device type")
    plan.add_argument("--memory", type=_size, help="memory of each device, e.g. 80GiB (default: this one's)")
    plan.add_argument(
        "--prompt-chars", type=int, default=600, help="prompt length assumed when the task is not readable"
    )
    plan.set_defaults(func=_cmd_plan)
    demo = sub.add_parser("demo", help="the main job: quickstart notebook, HACPO vs GSPO on tiny agents")
    demo.add_argument("--smoke", action="store_true", help="a few steps only (seconds, for CI)")
    demo.add_argument("--seeds", **{**seeds, "help": "training seeds (default 0: a smoke test)"})
    demo.set_defaults(func=_cmd_demo)
    rep = sub.add_parser("reproduce", help="re-execute every benchmark and ablation notebook with papermill")
    rep.add_argument("--smoke", action="store_true", help="shrink every experiment to seconds")
    rep.add_argument(
        "--only", action="append", choices=["benchmarks", "ablations", "figures"], help="only these"
    )
    rep.add_argument("--seeds", **seeds)
    rep.set_defaults(func=_cmd_reproduce)
    ev = sub.add_parser("eval", help="evaluate a run's agents (or a model) on benchmarks and task sources")
    ev.add_argument("target", help="a run directory, or a model (tiny:gpt2-char, a directory, a hub id)")
    ev.add_argument("--agent", action="append", help="with a run directory: only this agent (repeatable)")
    ev.add_argument(
        "--source", action="append", help="task source, or 'paper' for the 7 benchmarks (repeatable)"
    )
    ev.add_argument("--n", type=int, help="items per source (default: the run's eval_size / whole files)")
    ev.add_argument("--k", type=int, default=0, help="sampled responses per item: avg@k, pass@k, best@k")
    ev.add_argument("--temperature", type=float, default=1.0, help="temperature of the k samples")
    ev.add_argument("--max-new-tokens", type=int, help="response cap")
    ev.add_argument("--reward", help="grader or package.module:function (default: the run's)")
    ev.add_argument("--metric", help="metric of the Table-1 layout (default avg@k, or greedy_acc)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the item subset and the samples")
    ev.add_argument("--out", help="output folder (default results/eval/<run or model>)")
    ev.set_defaults(func=_cmd_eval)
    ex = sub.add_parser("export", help="write a run's trained agents with save_pretrained")
    ex.add_argument("run_dir", help="results/<experiment>/<run-id>")
    ex.add_argument("--agent", action="append", help="only this agent (repeatable)")
    ex.add_argument("--out", help="output folder (default <run_dir>/export)")
    ex.add_argument(
        "--merged", action="store_true", help="LoRA agents: also the adapters merged into the base"
    )
    ex.set_defaults(func=_cmd_export)
    summ = sub.add_parser(
        "summarize", help="tables of every run (mean ± std over seeds) and the generated results section"
    )
    summ.add_argument(
        "results_root",
        nargs="*",
        default=["results"],
        help="where the run directories are (one folder or more)",
    )
    summ.add_argument("--out", help="summary folder (default RESULTS_ROOT/summary, beside the runs)")
    summ.add_argument(
        "--force", action="store_true", help="replace a summary committed to git (results/summary/)"
    )
    summ.add_argument(
        "--same-code",
        metavar="V1,V2",
        help="pool the runs of these code versions (environment.json code_version) as one: you vouch that "
        "they train alike (e.g. they differ in logging only); groups.csv records it",
    )
    summ.add_argument("--readme", help="also rewrite the results section of this file (e.g. docs/results.md)")
    summ.add_argument(
        "--check-against",
        metavar="COMPARISON_CSV",
        help="check this summary (a rerun) against a committed comparison.csv: each mean within 2 SE; "
        "writes rerun_check.csv",
    )
    summ.set_defaults(func=_cmd_summarize)
    zoo = sub.add_parser("zoo", help="the shipped agents (zoo/): list them, or rebuild one on this machine")
    zoo.add_argument("action", choices=["list", "build"])
    zoo.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="tiny:<preset> or warm:<name> (build: default every tiny preset)",
    )
    zoo.add_argument(
        "--ship", action="store_true", help="replace the shipped weights and card with the rebuild"
    )
    zoo.set_defaults(func=_cmd_zoo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m workbench`` and the ``hacpo-workbench`` script."""
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    from workbench.config.experiment import ConfigError
    from workbench.core.lock import RunLockedError
    from workbench.core.storage import StorageError, UnsafeCheckpointError

    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, StorageError, RunLockedError, UnsafeCheckpointError) as exc:
        # Named failures a person can fix (the message says how): one line, no traceback.
        log.error("error: %s", exc)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: train() has logged how to resume
        return 130


def cli() -> int:
    """`main` for a process of its own (``python -m workbench``, the ``hacpo-workbench`` script): once the
    command has returned, a late Ctrl-C is ignored, so that it cannot turn a finished (or already
    interrupted, exit 130) command into a death by signal while the interpreter shuts down."""
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(cli())
