"""Batch reruns with papermill: the demo notebook and ``python -m workbench reproduce``.

Each job executes one notebook of ``notebooks/`` with parameters into ``results/<name>/`` (the executed
notebook next to the CSV/LaTeX tables and PNG/SVG/HTML figures it writes), once per seed of ``seeds``.
Training inside the notebooks goes through :func:`workbench.train.run.train` with ``resume=True``, so a rerun
skips runs that are complete with the same config and resumes interrupted ones. ``reproduce`` ends with
``results/index.md`` linking everything.

Notebooks run with their own folder as working directory, as a JupyterLab kernel does: every path a notebook
uses goes through `workbench.core.env.project_path`, so ``experiments/...`` and ``results/...`` mean the
project's folders wherever the kernel starts. Every experiment a job trains is checked by
`workbench.train.preflight` before the first notebook starts, so a bad input is named before a model loads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.config.loading import load_experiment
from workbench.core.env import PROJECT_ROOT, output_paths, project_path, project_paths
from workbench.core.io import atomic_write_text
from workbench.train.preflight import check_experiment

__all__ = [
    "JOBS",
    "KERNEL",
    "QUICKSTART",
    "Job",
    "execute_notebook",
    "kernel_name",
    "output_paths",
    "preflight",
    "project_path",
    "project_paths",
    "reproduce",
    "run_overrides",
    "run_quickstart",
    "smoke_overrides",
    "write_index",
]

log = logging.getLogger(__name__)
ROOT = PROJECT_ROOT
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "hacpo-workbench"
"""The project's kernel (``make venv`` registers it in ``.venv``); every notebook names it."""
QUICKSTART = "experiments/quickstart.yaml"
"""The experiment of the demo (``01_quickstart``'s default ``config``)."""


@dataclass(frozen=True)
class Job:
    """One notebook execution of ``reproduce``."""

    notebook: str
    """File name in ``notebooks/``."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Papermill parameters (``smoke``, ``seeds``, ``out_dir`` and ``results_root`` are added by the runner);
    ``config`` / ``configs`` name what the job trains, checked before any notebook starts."""
    description: str = ""
    """One line for the results index."""


JOBS: dict[str, Job] = {
    "benchmarks": Job(
        "03_benchmarks.ipynb",
        {"config": QUICKSTART},
        description="GRPO, GSPO, GSPO×2, Naive and HACPO side by side (Table 1, Figure 3)",
    ),
    "ablations": Job(
        "04_ablations.ipynb",
        {"config": "experiments/pairs/model.yaml"},
        description="HACPO against −Adv, −ω, the α sweep, no Stepwise, no Clip, Naive and symmetric Naive "
        "(Tables 2-4, Figure 4)",
    ),
    "regime": Job(
        "06_regime.ipynb",
        {"config": "experiments/pairs/model.yaml"},
        description="HACPO − GSPO against the samples behind P̂ a step (P = 4 to 32)",
    ),
    "figures": Job("05_figures.ipynb", description="every figure and table regenerated from results/ only"),
}
"""The ``reproduce`` jobs by name, in execution order (figures last: it reads what the others wrote)."""


def smoke_overrides() -> dict[str, Any]:
    """Overrides that shrink any experiment to seconds (CI, ``--smoke``): 2 steps of 4 prompts × 2."""
    return {
        "train.steps": 2,
        "train.prompts_per_step": 4,
        "train.group_size": 2,
        "train.minibatch_prompts": 2,
        "train.eval_every": 0,
        "train.save_every": 1,
        "train.max_new_tokens": 12,
        "task.train_size": 32,
        "task.eval_size": 8,
    }


def run_overrides(
    smoke: bool = False,
    results_root: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    lr_schedule: str = "",
    warmup_ratio: float = 0.0,
    rewards: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Overrides a notebook applies to every experiment it trains: the notebook's own ``overrides`` (config
    keys: ``{"train.steps": 20}``), its learning-rate schedule and reward parameters, then smoke sizes and
    the results root.

    Args:
        smoke: Tiny sizes for CI (`smoke_overrides`).
        results_root: Root of the run directories; a relative one is the project's (`project_path`),
            wherever the kernel runs.
        overrides: Config keys set in every run.
        lr_schedule: ``train.lr_schedule`` (``constant``, ``linear``, ``cosine``...); empty keeps the
            experiment's.
        warmup_ratio: ``train.warmup_ratio``, set when above 0.
        rewards: ``task.rewards`` (``[{"fn": "math_verify", "weight": 1}, ...]``); empty keeps the
            experiment's.
    """
    chosen = dict(overrides or {})
    if lr_schedule:
        chosen["train.lr_schedule"] = lr_schedule
    if warmup_ratio:
        chosen["train.warmup_ratio"] = warmup_ratio
    if rewards:
        chosen["task.rewards"] = [dict(term) for term in rewards]
    if smoke:
        chosen |= smoke_overrides()
    if results_root:
        chosen["output.root"] = str(project_path(results_root))
    return chosen


def _experiment_paths(parameters: dict[str, Any]) -> list[Path]:
    """The experiment YAMLs a job trains: its ``config`` and every file of its ``configs`` (folders too)."""
    named = ([parameters["config"]] if "config" in parameters else []) + list(parameters.get("configs", []))
    paths = []
    for path in project_paths(*named):
        paths += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    return paths


def preflight(configs: Sequence[str | Path], overrides: dict[str, Any] | None = None) -> None:
    """Load and check every experiment (`workbench.train.preflight`) before anything trains.

    Raises:
        ConfigError: The first experiment with a bad input; the message names every bad field.
    """
    for path in configs:
        check_experiment(load_experiment(project_path(path), overrides))


def kernel_name() -> str:
    """`KERNEL` when it is registered (``make venv`` does it), else ``python3`` (this interpreter's)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        log.warning("kernel %r is not registered (run `make venv`); using python3", KERNEL)
        return "python3"
    return KERNEL


def execute_notebook(
    notebook: str | Path,
    out_dir: str | Path,
    parameters: dict[str, Any] | None = None,
    *,
    cwd: str | Path | None = None,
    progress: bool = False,
) -> Path:
    """Execute ``notebook`` with papermill into ``out_dir/<name>`` (atomically) and return that path.

    Args:
        notebook: A file name in ``notebooks/`` or a path.
        out_dir: Where the executed notebook goes (a relative path is the project's).
        parameters: Papermill parameters.
        cwd: The kernel's working directory; default the notebook's folder, as in JupyterLab, so that a
            notebook that runs here runs there too.
        progress: Show papermill's cell progress bar.
    """
    import papermill

    source = Path(notebook)
    if not source.is_absolute():
        source = NOTEBOOKS / source
    if not source.is_file():
        available = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
        raise FileNotFoundError(f"notebook {str(source)!r} not found; available: {available}")
    out_dir = project_path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / source.name
    partial = out_dir / f".{source.stem}.partial.ipynb"
    start = time.perf_counter()
    with _quiet_kernel():
        papermill.execute_notebook(
            str(source),
            str(partial),
            parameters=parameters or {},
            kernel_name=kernel_name(),
            cwd=str(cwd or source.parent),
            progress_bar=progress,  # a cell-level bar: the kernel's own output lands in the executed notebook
        )
    partial.replace(target)
    log.info("executed %s in %.0f s -> %s", source.name, time.perf_counter() - start, target)
    return target


@contextlib.contextmanager
def _quiet_kernel() -> Iterator[None]:
    """``HACPO_PROGRESS=0`` in the environment the kernel inherits (unless set): no progress bars inside a
    step fill the executed notebook (`workbench.core.progress`)."""
    saved = os.environ.get("HACPO_PROGRESS")
    os.environ.setdefault("HACPO_PROGRESS", "0")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HACPO_PROGRESS", None)


def _seed_parameters(seeds: Sequence[int] | None) -> dict[str, Any]:
    if seeds is None:
        return {}
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds = {seeds!r} is not allowed: a non-empty list of distinct integers")
    return {"seeds": seeds}


def run_quickstart(
    smoke: bool = False,
    out_dir: str | Path | None = None,
    results_root: str | Path | None = None,
    *,
    seeds: Sequence[int] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """The main job: execute ``01_quickstart.ipynb`` and return its table and the files it wrote.

    Args:
        smoke: A few tiny steps (CI).
        out_dir: Where the executed notebook, tables and figures go (default ``results/quickstart``;
            ``results/smoke/quickstart`` with ``smoke``).
        results_root: Root of the run directories (default ``results/runs``, the one ``05_figures`` reads;
            ``results/smoke/runs`` with ``smoke``, so smoke runs never mix with results).
        seeds: Training seeds, one run directory per algorithm and seed (default: the notebook's, ``[0]``).
        progress: Show papermill's cell progress bar.

    Returns:
        ``{"table": DataFrame (accuracy.csv: per agent and metric, mean/std/n/se of initial, each method and
        the gains), "text": accuracy.md (the table to print, with its seeds note), "files": [paths],
        "notebook": path}``.

    Raises:
        ConfigError: A bad input in the quickstart experiment (before any model loads).
    """
    base = "results/smoke" if smoke else "results"
    out_dir, results_root = project_paths(out_dir or f"{base}/quickstart", results_root or f"{base}/runs")
    preflight([QUICKSTART], run_overrides(smoke, results_root))
    before = set(out_dir.iterdir()) if out_dir.exists() else set()
    params = {"smoke": smoke, "out_dir": str(out_dir), "results_root": str(results_root)}
    notebook = execute_notebook(
        "01_quickstart.ipynb", out_dir, params | _seed_parameters(seeds), progress=progress
    )
    table = pd.read_csv(out_dir / "accuracy.csv", index_col="agent")
    text = (out_dir / "accuracy.md").read_text(encoding="utf-8")
    # Tables, figures and the notebook, plus the run directories (not every checkpoint file inside them).
    files = sorted(p for p in out_dir.iterdir() if p not in before or p == notebook)
    return {"table": table, "text": text, "files": files, "notebook": notebook}


def reproduce(
    smoke: bool = False,
    only: list[str] | None = None,
    results_root: str | Path = "results",
    *,
    seeds: Sequence[int] | None = None,
    progress: bool = False,
) -> Path:
    """Execute every ``JOBS`` notebook (or ``only`` those) into ``results/<name>/``; write the index.

    Args:
        smoke: Shrink every experiment to seconds (``smoke_overrides``), into ``results/smoke/<name>/``.
        only: Job names to run (default: all), e.g. ``["benchmarks"]``.
        results_root: Root of all outputs (run directories go to its ``runs/``).
        seeds: Training seeds, one run directory per experiment and seed (default: each notebook's, [0, 1, 2];
            ``[0]`` with ``smoke``).
        progress: Show papermill's cell progress bars.

    Returns:
        The path of ``results/index.md`` (``results/smoke/index.md`` with ``smoke``).

    Raises:
        ValueError: An unknown job name, or bad seeds.
        ConfigError: A bad input in an experiment a job trains (every job is checked before the first runs).
    """
    names = list(JOBS) if not only else list(only)
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise ValueError(f"unknown job {unknown[0]!r}; valid names: {list(JOBS)}")
    root = project_path(results_root) / ("smoke" if smoke else "")
    runs = root / "runs"
    for name in names:
        preflight(_experiment_paths(JOBS[name].parameters), run_overrides(smoke, runs))
    for name in names:
        job = JOBS[name]
        out_dir = root / name
        params = {**job.parameters, "smoke": smoke, "out_dir": str(out_dir), "results_root": str(runs)}
        if name != "figures":  # a smoke run is one seed unless asked otherwise
            params |= _seed_parameters(seeds if seeds is not None or not smoke else [0])
        execute_notebook(job.notebook, out_dir, params, progress=progress)
    return write_index(root)


def write_index(root: Path) -> Path:
    """``index.md`` under ``root``: one section per job with links to every file it produced."""
    lines = ["# Results index", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.", ""]
    for name, job in JOBS.items():
        out_dir = root / name
        if not out_dir.is_dir():
            continue
        lines += [f"## {name}", "", job.description, ""]
        for path in sorted(p for p in out_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
            rel = path.relative_to(root)
            lines.append(f"- [{rel}]({rel})")
        lines.append("")
    index = root / "index.md"
    atomic_write_text(index, "\n".join(lines))
    return index
