"""What a run ran on (``environment.json``) and which code made it (`workbench.core.machine.code_version`).

`collect_environment` records, at each start of a run: Python, platform and package versions (torch,
transformers, peft, bitsandbytes, tokenizers, numpy...), the CPU (model name and the SIMD flags that select
float kernels, from ``/proc/cpuinfo`` when there is one), torch's intra- and inter-op thread counts and the
thread variables of the environment (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ``MKL_NUM_THREADS``), the
device, the git commit and `code_version`. `workbench.train.run` adds each agent's starting-weights digest
(``start_weights``) once the agents are loaded.

`code_version` hashes the workbench's own source files (the tiny zoo's recipe version among them): two runs
with the same config but different code get different versions, so a finished run is never silently reused
after the code changed, and aggregation across seeds can refuse to average runs of different code.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.core.machine import code_version, cpu_info, library_versions, read_cpuinfo, thread_settings


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _device_info() -> dict[str, Any]:
    """Device and thread facts from torch when it is importable (it always is in the workbench's venv)."""
    try:
        import torch
    except ImportError:
        return {"device": "unknown (torch not importable)"}
    info: dict[str, Any] = {
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        # The instruction set torch's own CPU kernels dispatch to ("AVX512", "AVX2", "DEFAULT"...).
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        info.update(
            device=f"cuda ({torch.cuda.get_device_name(0)})",
            cuda_version=torch.version.cuda,
            cuda_device_count=torch.cuda.device_count(),
        )
    return info


def collect_environment() -> dict[str, Any]:
    """Python, platform, package versions, CPU, thread settings, device, git commit (None outside a git
    checkout), code version and start time."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "start_time": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cwd": str(Path.cwd()),
        "argv": list(sys.argv),
        "packages": library_versions(),
        "cpu": cpu_info(read_cpuinfo()),
        "thread_variables": thread_settings(),
        **_device_info(),
        "code_version": code_version(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }
