"""Where the workbench runs: every environment variable it reads (read when asked, never at import time), and
project paths that mean the same wherever the process runs.

| variable | default | meaning |
|---|---|---|
| ``HACPO_CACHE`` | ``~/.cache/hacpo-workbench`` | converted embedded models and built tiny agents |
| ``HACPO_TINY_WARM_STEPS`` | unset | every tiny preset's warm-start steps (tests build in seconds) |
| ``HACPO_DATA_DIR`` | unset | where the paper's data files are looked up (`workbench.tasks.loaders`) |
| ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` | unset | Hugging Face's own switches; read to explain errors |
| ``HACPO_PROGRESS`` | ``auto`` | progress bars inside a step: ``0`` off, ``1`` on, ``auto`` on except under |
| | | pytest (``PYTEST_CURRENT_TEST``); the papermill runner sets ``0`` for the notebooks it executes |

A kernel started by JupyterLab runs in ``notebooks/``; papermill and the command line usually run in the
project root. Paths written in notebooks' parameters and experiment files (``experiments/quickstart.yaml``,
``results/runs``) are the project's, so `project_path` resolves them against the project root unless they
exist from the working directory (a user's own file next to where they typed the command).

Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "PROJECT_ROOT",
    "SMOKE_ROOT",
    "cache_root",
    "data_dir",
    "hub_offline",
    "output_paths",
    "progress_enabled",
    "project_path",
    "project_paths",
    "tiny_warm_steps",
]


DATA_DIR_ENV = "HACPO_DATA_DIR"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
"""The folder holding the ``workbench`` package: the project root of a checkout (notebooks/, experiments/)."""


def cache_root() -> Path:
    """The workbench cache directory: ``$HACPO_CACHE``, default ``~/.cache/hacpo-workbench``."""
    return Path(os.environ.get("HACPO_CACHE") or "~/.cache/hacpo-workbench").expanduser()


def tiny_warm_steps() -> int | None:
    """``$HACPO_TINY_WARM_STEPS`` as an integer, or None when unset.

    Raises:
        ValueError: The variable is set to something other than a non-negative integer.
    """
    raw = os.environ.get("HACPO_TINY_WARM_STEPS", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"HACPO_TINY_WARM_STEPS = {raw!r} is not allowed: a non-negative integer, or unset")
    return int(raw)


def data_dir() -> Path | None:
    """``$HACPO_DATA_DIR`` as a path, or None when unset."""
    raw = os.environ.get(DATA_DIR_ENV)
    return Path(raw).expanduser() if raw else None


def hub_offline(*, datasets: bool = False) -> bool:
    """True when ``HF_HUB_OFFLINE`` (with ``datasets`` also ``HF_DATASETS_OFFLINE``) is set (truthy)."""
    keys = ["HF_HUB_OFFLINE"] + (["HF_DATASETS_OFFLINE"] if datasets else [])
    return any(os.environ.get(k, "0").strip() not in ("", "0", "false", "False") for k in keys)


def progress_enabled() -> bool:
    """Whether progress bars are drawn: ``$HACPO_PROGRESS`` (``0``/``off``/``false``: no; ``1``/``on``/
    ``true``: yes), else yes unless pytest runs a test (``PYTEST_CURRENT_TEST``)."""
    raw = os.environ.get("HACPO_PROGRESS", "auto").strip().lower()
    if raw in ("0", "off", "false", "no"):
        return False
    if raw in ("1", "on", "true", "yes"):
        return True
    return "PYTEST_CURRENT_TEST" not in os.environ


# Project paths (the CLI, papermill, a JupyterLab kernel).

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
