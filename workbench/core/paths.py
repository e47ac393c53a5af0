"""Project paths that mean the same wherever the process runs: the CLI, papermill, or a JupyterLab kernel.

A kernel started by JupyterLab runs in ``notebooks/``; papermill and the command line usually run in the
project root. Paths written in notebooks' parameters and experiment files (``experiments/quickstart.yaml``,
``results/runs``) are the project's, so `project_path` resolves them against the project root unless they
exist from the working directory (a user's own file next to where they typed the command).

Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from workbench.core.env import PACKAGE_PARENT

__all__ = ["PROJECT_ROOT", "SMOKE_ROOT", "output_paths", "project_path", "project_paths"]

PROJECT_ROOT = PACKAGE_PARENT
"""The folder holding ``workbench/``, ``notebooks/``, ``experiments/`` and ``results/`` in a checkout."""
SMOKE_ROOT = PROJECT_ROOT / "results" / "smoke"
"""Where a smoke run's outputs go instead of the project's ``results/`` (CI and quick checks)."""


def project_path(path: str | Path) -> Path:
    """``path`` as an absolute path: as given when absolute (``~`` expanded), else from the working
    directory when it exists there, else under the project root.

    Args:
        path: A file or folder, existing (an experiment YAML) or to be created (a results folder).

    Returns:
        The absolute path.
    """
    given = Path(path).expanduser()
    if given.is_absolute():
        return given
    if given.exists():
        return given.resolve()
    return PROJECT_ROOT / given


def project_paths(*paths: str | Path) -> tuple[Path, ...]:
    """`project_path` of each argument, in order (one line in a notebook for all of its paths)."""
    return tuple(project_path(p) for p in paths)


def output_paths(smoke: bool, *paths: str | Path) -> tuple[Path, ...]:
    """`project_paths` of a notebook's output folders, and in smoke mode (``smoke=True``: CI, quick checks)
    each one under the project's ``results/`` moved to `SMOKE_ROOT` (``results/runs`` →
    ``results/smoke/runs``), so a smoke run never writes where a full run writes."""
    out = []
    results = PROJECT_ROOT / "results"
    for path in project_paths(*paths):
        if smoke and path.is_relative_to(results) and not path.is_relative_to(SMOKE_ROOT):
            path = SMOKE_ROOT / path.relative_to(results)
        out.append(path)
    return tuple(out)
