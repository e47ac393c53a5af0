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

__all__ = ["PROJECT_ROOT", "project_path", "project_paths"]

PROJECT_ROOT = PACKAGE_PARENT
"""The folder holding ``workbench/``, ``notebooks/``, ``experiments/`` and ``results/`` in a checkout."""


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
