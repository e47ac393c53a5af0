"""What a run ran on: Python, platform, package versions, device and git commit (``environment.json``)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_ENV_PACKAGES = (
    "torch", "transformers", "peft", "bitsandbytes", "tokenizers", "safetensors", "numpy", "pandas",
    "math-verify", "reasoning-gym", "altair", "papermill", "hacpo-workbench",
)  # fmt: skip


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _device_info() -> dict[str, Any]:
    """Device facts from torch when it is importable (it always is in the workbench's venv)."""
    try:
        import torch
    except ImportError:
        return {"device": "unknown (torch not importable)"}
    info: dict[str, Any] = {"device": "cpu", "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info.update(
            device=f"cuda ({torch.cuda.get_device_name(0)})",
            cuda_version=torch.version.cuda,
            cuda_device_count=torch.cuda.device_count(),
        )
    return info


def collect_environment() -> dict[str, Any]:
    """Python, platform, package versions, device, git commit (None outside a git checkout), start time."""
    versions: dict[str, str | None] = {}
    for name in _ENV_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "start_time": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cwd": str(Path.cwd()),
        "argv": list(sys.argv),
        "packages": versions,
        **_device_info(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }
