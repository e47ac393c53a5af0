"""Batch reruns with papermill: the demo notebook and ``python -m workbench reproduce``.

Each job executes one notebook of ``notebooks/`` with parameters into ``results/<name>/`` (the executed
notebook next to the CSV/LaTeX tables and PNG/SVG/HTML figures it writes). Training inside the notebooks goes
through :func:`workbench.train.trainer.train` with ``resume=True``, so a rerun skips runs that are complete
with the
same config and resumes interrupted ones. ``reproduce`` ends with ``results/index.md`` linking everything.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.core.env import PACKAGE_PARENT
from workbench.core.io import atomic_write_text

__all__ = [
    "JOBS",
    "Job",
    "execute_notebook",
    "reproduce",
    "run_overrides",
    "run_quickstart",
    "smoke_overrides",
    "write_index",
]

log = logging.getLogger(__name__)
ROOT = PACKAGE_PARENT
NOTEBOOKS = ROOT / "notebooks"


@dataclass(frozen=True)
class Job:
    """One notebook execution of ``reproduce``."""

    notebook: str
    """File name in ``notebooks/``."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Papermill parameters (``smoke`` and ``out_dir`` are added by the runner)."""
    description: str = ""
    """One line for the results index."""


JOBS: dict[str, Job] = {
    "benchmarks": Job(
        "03_benchmarks.ipynb",
        description="GRPO, GSPO, GSPO×2, Naive and HACPO side by side (Table 1, Figure 3)",
    ),
    "ablations": Job(
        "04_ablations.ipynb", description="−Adv, −ω, α sweep, no stepwise, no clip (Tables 2-4, 6, Figure 4)"
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


def run_overrides(smoke: bool = False, results_root: str | None = None) -> dict[str, Any]:
    """Overrides a notebook applies to every experiment it trains: smoke sizes and the results root."""
    overrides = smoke_overrides() if smoke else {}
    if results_root:
        overrides["output.root"] = str(results_root)
    return overrides


def execute_notebook(
    notebook: str | Path,
    out_dir: str | Path,
    parameters: dict[str, Any] | None = None,
    *,
    progress: bool = False,
) -> Path:
    """Execute ``notebook`` with papermill into ``out_dir/<name>`` (atomically) and return that path.

    The kernel runs with the repository root as working directory, so relative paths in parameters
    (``experiments/...``, ``results/...``) mean the same as on the command line.
    """
    import papermill

    source = Path(notebook)
    if not source.is_absolute():
        source = NOTEBOOKS / source
    if not source.is_file():
        available = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
        raise FileNotFoundError(f"notebook {str(source)!r} not found; available: {available}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / source.name
    partial = out_dir / f".{source.stem}.partial.ipynb"
    start = time.perf_counter()
    papermill.execute_notebook(
        str(source),
        str(partial),
        parameters=parameters or {},
        kernel_name="python3",
        cwd=str(ROOT),
        progress_bar=progress,  # a cell-level bar: the kernel's own output lands in the executed notebook
    )
    partial.replace(target)
    log.info("executed %s in %.0f s -> %s", source.name, time.perf_counter() - start, target)
    return target


def run_quickstart(
    smoke: bool = False,
    out_dir: str | Path = "results/quickstart",
    results_root: str | Path = "results",
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """The main job: execute ``01_quickstart.ipynb`` and return its table and the files it wrote.

    Args:
        smoke: A few tiny steps (CI).
        out_dir: Where the executed notebook, tables and figures go.
        results_root: Root of the run directories.
        progress: Show papermill's cell progress bar.

    Returns:
        ``{"table": DataFrame (per agent: initial, gspo, hacpo, gain), "files": [paths], "notebook": path}``.
    """
    out_dir = (ROOT / out_dir) if not Path(out_dir).is_absolute() else Path(out_dir)
    before = set(out_dir.iterdir()) if out_dir.exists() else set()
    params = {"smoke": smoke, "out_dir": str(out_dir), "results_root": str(results_root)}
    notebook = execute_notebook("01_quickstart.ipynb", out_dir, params, progress=progress)
    table = pd.read_csv(out_dir / "accuracy.csv", index_col="agent")
    # Tables, figures and the notebook, plus the run directories (not every checkpoint file inside them).
    files = sorted(p for p in out_dir.iterdir() if p not in before or p == notebook)
    return {"table": table, "files": files, "notebook": notebook}


def reproduce(
    smoke: bool = False,
    only: list[str] | None = None,
    results_root: str | Path = "results",
    *,
    progress: bool = False,
) -> Path:
    """Execute every ``JOBS`` notebook (or ``only`` those) into ``results/<name>/``; write the index.

    Args:
        smoke: Shrink every experiment to seconds (``smoke_overrides``), into ``results/smoke/<name>/``.
        only: Job names to run (default: all), e.g. ``["benchmarks"]``.
        results_root: Root of all outputs.
        progress: Show papermill's cell progress bars.

    Returns:
        The path of ``results/index.md`` (``results/smoke/index.md`` with ``smoke``).
    """
    names = list(JOBS) if not only else list(only)
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise ValueError(f"unknown job {unknown[0]!r}; valid names: {list(JOBS)}")
    root = Path(results_root)
    root = (ROOT / root if not root.is_absolute() else root) / ("smoke" if smoke else "")
    for name in names:
        job = JOBS[name]
        out_dir = root / name
        params = {
            **job.parameters,
            "smoke": smoke,
            "out_dir": str(out_dir),
            "results_root": str(root / "runs"),
        }
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
