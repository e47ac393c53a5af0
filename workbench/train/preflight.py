"""Pre-flight: every bad input of an experiment named before any model loads.

The config dataclasses validate types and ranges when a config is made; what they cannot know without
looking at the machine is checked here, in a second or two, before ``train`` builds any agent:

| checked | how |
|---|---|
| ``agents[i].model`` / ``.tokenizer`` | tiny preset names, embedded models' packages, directories holding a |
| | ``config.json``, hub ids present in the cache when offline
(`workbench.agents.models.loading.model_problem`) |
| ``agents[i].device``, ``.quantization`` | a CUDA device exists; bitsandbytes imports |
| ``agents[i].lora`` | peft builds its ``LoraConfig`` (peft's own checks of the fields together) |
| ``task.reward`` | a built-in method, or a custom ``package.module:function`` that imports and grades |
| ``task.source`` / ``task.knobs`` | the source exists and its knobs are its own; files are read and every |
| | record's layout detected; generators make a few problems with the given knobs |
| ``task.eval_source`` / ``eval_knobs`` | the same, and held-out questions never appear in training |

`check_experiment` raises one `ConfigError` holding one paragraph per problem (field, value, what is
allowed); the command line prints it and exits with code 2.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from typing import Any

import torch

from workbench.agents.models.hf import lora_config
from workbench.agents.models.loading import model_problem
from workbench.agents.models.warm import WARM_STARTS
from workbench.config.agent_spec import AgentSpecError
from workbench.config.checks import ConfigError
from workbench.config.experiment import ExperimentConfig
from workbench.core.types import TaskItem
from workbench.tasks.rewards import reward_problem
from workbench.tasks.sources import check_disjoint, knobs_of, load_tasks
from workbench.train.tracking import report_to_problem

__all__ = [
    "GENERATED_ITEMS",
    "check_experiment",
    "experiment_problems",
    "warm_start_mismatches",
]

log = logging.getLogger(__name__)

GENERATED_ITEMS = 16
"""Problems a generator (``embedded``, ``gym:``) makes in the check: enough to exercise its knobs."""


def _generated(source: str) -> bool:
    return source == "embedded" or source.startswith("gym:")


def _load(
    field: str, source: str, knobs: Mapping[str, Any], split: str, n: int, seed: int
) -> tuple[list[TaskItem] | None, str | None]:
    """Items of one source, or the paragraph naming why they cannot be loaded."""
    accepted = knobs_of(source)
    unknown = sorted(set(knobs) - accepted) if accepted is not None else []
    knobs_field = "task.knobs" if field == "task.source" else field.replace("source", "knobs")
    if unknown:
        return None, (
            f"{knobs_field} = {dict(knobs)} is not allowed for {field} = {source!r}: {unknown} belong to "
            f"another source; {source!r} accepts {sorted(accepted)}"
        )
    size = min(n, GENERATED_ITEMS) if _generated(source) else n
    try:
        return load_tasks(source, split=split, n=size, seed=seed, **knobs), None
    except (ValueError, FileNotFoundError, ImportError, TypeError) as exc:
        with_knobs = f" with {knobs_field} = {dict(knobs)}" if knobs else ""
        return None, f"{field} = {source!r}{with_knobs}: {exc}"


def _task_problems(cfg: ExperimentConfig) -> list[str]:
    task = cfg.task
    train, problem = _load("task.source", task.source, task.knobs, "train", task.train_size, cfg.seed)
    problems = [problem] if problem else []
    if not task.eval_size:
        return problems
    for field, source, knobs in task.held_out_sources():
        held_out, problem = _load(field, source, knobs, "test", task.eval_size, cfg.seed)
        if problem:
            problems.append(problem)
        elif train is not None and not (_generated(source) and source == task.source):
            try:  # generated sources split by hash: disjoint by construction
                check_disjoint(train, held_out, f"{field} = {source!r}")
            except ValueError as exc:
                same = field == "task.source"  # no eval_source: the held-out split of the training source
                problems.append(
                    f"task.knobs = {dict(knobs)} with no task.eval_source evaluates on training questions: "
                    "drop holdout (the default 'hash' holds out part of the file) or set task.eval_source"
                    if same
                    else str(exc)
                )
    return problems


def _agent_problems(cfg: ExperimentConfig) -> list[str]:
    problems = []
    for i, spec in enumerate(cfg.agents):
        problems.append(model_problem(spec.model, f"agents[{i}].model"))
        if spec.tokenizer:
            problems.append(model_problem(spec.tokenizer, f"agents[{i}].tokenizer"))
        if spec.device.startswith("cuda") and not torch.cuda.is_available():
            problems.append(
                f"agents[{i}].device = {spec.device!r} is not allowed on this machine: it has no CUDA "
                "device; use auto or cpu"
            )
        if spec.lora is not None:
            try:
                lora_config(spec.lora)  # peft's own checks of the combination
            except AgentSpecError as exc:
                problems.append(f"agents[{i}].{exc}")
        if spec.quantization != "none" and importlib.util.find_spec("bitsandbytes") is None:
            problems.append(
                f"agents[{i}].quantization = {spec.quantization!r} needs bitsandbytes, which is not "
                "installed: pip install bitsandbytes, or set quantization: none"
            )
    return [p for p in problems if p]


def experiment_problems(cfg: ExperimentConfig) -> list[str]:
    """Every problem of ``cfg`` found without loading a model: one paragraph each (field, value, allowed)."""
    problems = _agent_problems(cfg)
    reward = reward_problem(cfg.task.reward)
    problems += [reward] if reward else []
    problems += list(dict.fromkeys(_task_problems(cfg)))  # a shared train/held-out source: once
    report_to = getattr(cfg.output, "report_to", ())
    if report_to:
        problem = report_to_problem(report_to)
        problems += [problem] if problem else []
    return problems


def warm_start_mismatches(cfg: ExperimentConfig) -> list[str]:
    """Each agent loaded from a warm start (``warm:<name>``) but prompted unlike its warm start was trained.

    Not an error (studying a warm start under another prompt is a fair experiment), but a warm-started
    model prompted differently usually loses most of its accuracy, so `check_experiment` logs each one. The
    problems asked are not part of the prompt: RL on other embedded knobs than the warm start's (the real
    pair trains on one-digit problems from two-digit warm starts) uses the same format and is not flagged.
    """
    lines = []
    for i, spec in enumerate(cfg.agents):
        preset = WARM_STARTS.get(spec.model.removeprefix("warm:")) if spec.model.startswith("warm:") else None
        if preset is None:
            continue
        differ = [
            f"{key} = {getattr(spec, key)!r} (trained with {value!r})"
            for key, value in preset.agent_fields().items()
            if getattr(spec, key) != value
        ]
        if cfg.task.instruction != preset.instruction:
            differ.append(
                f"task.instruction = {cfg.task.instruction!r} (trained with {preset.instruction!r})"
            )
        if differ:
            lines.append(
                f"agents[{i}] ({spec.model}) is prompted unlike its warm start: " + "; ".join(differ)
            )
    return lines


def check_experiment(cfg: ExperimentConfig) -> None:
    """Raise `ConfigError` naming every problem of ``cfg`` (see `experiment_problems`); None when clean.

    Also logs a warning for each agent prompted unlike its warm start (`warm_start_mismatches`).
    """
    for line in warm_start_mismatches(cfg):
        log.warning("%s", line)
    problems = experiment_problems(cfg)
    if problems:
        head = f"experiment {cfg.experiment!r}: {len(problems)} bad input(s), found before any model loaded:"
        raise ConfigError("\n\n".join([head, *problems]))
    log.debug("pre-flight of %s: clean", cfg.experiment)
