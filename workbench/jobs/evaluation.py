"""``python -m workbench eval``: trained agents (or any model) on the paper's benchmarks and any task source.

A target is a run directory (every agent, or those named, with their trained weights: the newest intact
checkpoint) or a model string (``tiny:gpt2-char``, ``smollm2-135m-instruct``, a directory, a hub id). Each
agent answers each source's held-out items greedily and, with ``k > 0``, k sampled times; the results are
greedy accuracy, avg@k, unbiased pass@j and best@k (`workbench.tasks.metrics`). Written to ``out_dir``:

| file | content |
|---|---|
| ``evals.csv`` | tidy: ``run, algorithm, step, agent, benchmark, metric, value, items`` |
| ``samples.jsonl`` | every response with its reward and grading reason |
| ``table1.csv`` / ``.tex`` | the Table-1 layout of one metric (`workbench.lab.tables.paper_table`): a row |
| | per agent (and method), a column per benchmark and AVG (their unweighted mean), each with its se |

Sources are task sources (`workbench.tasks.sources.load_tasks`, ``test`` split); ``paper`` stands for the
paper's seven benchmarks (`PAPER_BENCHMARKS`), read from ``$HACPO_DATA_DIR``. Every source is loaded and
every agent's model string checked before the first model loads.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from workbench.agents.models.loading import checkpoint_step, is_run_dir, load_agent, model_problem, run_agents
from workbench.config.agent_spec import as_spec
from workbench.config.checks import ConfigError
from workbench.config.experiment import ExperimentConfig, from_dict
from workbench.core.env import project_path
from workbench.core.io import atomic_write_text
from workbench.core.types import TaskItem
from workbench.lab import latex
from workbench.lab.tables import paper_table
from workbench.tasks.prompts import PAPER_INSTRUCTION
from workbench.tasks.rewards import reward_problem
from workbench.tasks.sources import load_tasks
from workbench.train.evaluate import evaluate

__all__ = ["PAPER_BENCHMARKS", "EvalReport", "evaluate_target"]

log = logging.getLogger(__name__)

PAPER_BENCHMARKS = ("math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiadbench")
"""The paper's Table-1 columns, in order; ``--source paper`` expands to them."""


@dataclass
class EvalReport:
    """What `evaluate_target` produced: tidy evals, every sample, the Table-1 layout and the files."""

    evals: pd.DataFrame
    samples: pd.DataFrame
    table: pd.DataFrame
    metric: str
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    """Who answers what: agent names, how to load each, sources with knobs, and grading settings."""

    label: str
    run_dir: Path | None
    agents: list[Any]
    method: str
    sources: list[tuple[str, dict[str, Any]]]
    reward: str
    instruction: str | None
    n: int | None
    max_new_tokens: int | None


def _run_config(run_dir: Path) -> ExperimentConfig:
    return from_dict(yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")))


def _plan(target: str | Path, agents: Sequence[str] | None, sources: Sequence[str] | None) -> _Plan:
    """Resolve the target into agents and defaults (a run's own held-out sources, reward and instruction)."""
    path = project_path(target)
    given = [(s, {}) for name in sources or () for s in (PAPER_BENCHMARKS if name == "paper" else [name])]
    if is_run_dir(path):
        cfg = _run_config(path)
        names = [s.name for s in run_agents(path)]
        unknown = [a for a in agents or () if a not in names]
        if unknown:
            raise ConfigError(f"--agent {unknown[0]!r} is not allowed: the run {path} has the agents {names}")
        own = [(source, dict(knobs)) for _, source, knobs in cfg.task.held_out_sources()]
        return _Plan(
            label=f"{path.parent.name}/{path.name}",
            run_dir=path,
            agents=list(agents or names),
            method=cfg.method,
            sources=given or own,
            reward=cfg.task.reward,
            instruction=cfg.task.instruction,
            n=cfg.task.eval_size,
            max_new_tokens=cfg.train.eval_max_new_tokens or cfg.train.max_new_tokens,
        )
    model = str(target)
    problem = model_problem(model, "target")
    if problem:
        raise ConfigError(f"{problem}; or give a run directory (results/<experiment>/<run-id>)")
    tiny = model.startswith("tiny:")
    return _Plan(
        label=as_spec(model).display_name,
        run_dir=None,
        agents=[model],
        method="untrained",
        sources=given or [("embedded", {})],
        reward="math_verify",
        instruction=None if tiny else PAPER_INSTRUCTION,  # tiny agents learned the bare question
        n=None,
        max_new_tokens=None,
    )


def _load_items(plan: _Plan, n: int | None, seed: int) -> dict[str, list[TaskItem]]:
    """Every source's held-out items, or one ConfigError naming every source that fails (before models)."""
    items, problems = {}, []
    for source, knobs in plan.sources:
        try:
            items[source] = load_tasks(source, split="test", n=n, seed=seed, **knobs)
        except (ValueError, FileNotFoundError, ImportError) as exc:
            problems.append(f"--source {source!r}: {exc}")
    if problems:
        raise ConfigError("\n\n".join(problems))
    return items


def _write(report: EvalReport, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    evals, samples = out_dir / "evals.csv", out_dir / "samples.jsonl"
    atomic_write_text(evals, report.evals.to_csv(index=False))
    atomic_write_text(samples, report.samples.to_json(orient="records", lines=True, force_ascii=False))
    caption = f"{report.metric} per agent and benchmark"
    table = out_dir / "table1.tex"
    return [evals, samples, *latex.to_latex(report.table, table, caption, "tab:eval", best=None, decimals=3)]


def evaluate_target(
    target: str | Path,
    *,
    agents: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    n: int | None = None,
    k: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    reward: str | None = None,
    metric: str | None = None,
    seed: int = 0,
    out_dir: str | Path | None = None,
) -> EvalReport:
    """Evaluate a run's agents (or one model) on task sources and write the tidy CSV and Table 1.

    Args:
        target: A run directory or a model string.
        agents: With a run directory: agent names (default all).
        sources: Task sources or ``paper``; default the run's held-out sources (``embedded`` for a model).
        n: Items per source (default the run's ``eval_size``; every item of a file, 1000 generated).
        k: Sampled responses per item (0: greedy only); gives avg@k, pass@j and best@k.
        temperature: Sampling temperature of the k samples.
        max_new_tokens: Response cap (default the run's evaluation cap, else the agent's).
        reward: Grader (default the run's ``task.reward``, else ``math_verify``).
        metric: The metric of Table 1 (default ``avg@k`` with ``k > 0``, else ``greedy_acc``).
        seed: Seed of the item subset and of the samples.
        out_dir: Where the files go (default ``results/eval/<run or model>``).

    Raises:
        ConfigError: A bad target, agent, source or reward (all checked before any model loads).
    """
    plan = _plan(target, agents, sources)
    reward = reward or plan.reward
    problem = reward_problem(reward)
    if problem:
        raise ConfigError(problem.replace("task.reward", "--reward"))
    items = _load_items(plan, n if n is not None else plan.n, seed)
    metric = metric or (f"avg@{k}" if k > 0 else "greedy_acc")
    rows, samples = [], []
    for name in plan.agents:
        agent = load_agent(plan.run_dir, agent=name) if plan.run_dir else load_agent(name)
        step = checkpoint_step(plan.run_dir, name) if plan.run_dir else 0
        for source, source_items in items.items():
            result = evaluate(
                agent,
                source_items,
                k=k,
                temperature=temperature,
                max_new_tokens=max_new_tokens or plan.max_new_tokens,
                benchmark=source,
                instruction=plan.instruction,
                method=reward,
                agent_name=agent.name,
                seed=seed,
            )
            rows.append(result.summary.assign(step=step, items=len(source_items)))
            samples.append(result.samples)
            log.info("%s on %s: %s", agent.name, source, _line(result.summary))
        del agent
        gc.collect()
    evals = pd.concat(rows, ignore_index=True).assign(run=plan.label, algorithm=plan.method)
    evals = evals[["run", "algorithm", "step", "agent", "benchmark", "metric", "value", "items"]]
    if metric not in set(evals["metric"]):
        raise ConfigError(f"--metric {metric!r} is not allowed: measured {sorted(set(evals['metric']))}")
    table = paper_table(evals, metric)
    report = EvalReport(evals, pd.concat(samples, ignore_index=True), table, metric)
    out = Path(out_dir) if out_dir else project_path("results/eval") / plan.label.replace("/", "-")
    report.files = _write(report, out)
    return report


def _line(summary: pd.DataFrame) -> str:
    return ", ".join(f"{m} {v:.3f}" for m, v in zip(summary["metric"], summary["value"]))
