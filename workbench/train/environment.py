"""What a run ran on (``environment.json``) and which code made it (`code_version`, part of a run's identity).

`collect_environment` records, at each start of a run: Python, platform and package versions (torch,
transformers, peft, bitsandbytes, tokenizers, numpy...), the CPU (model name and the SIMD flags that select
float kernels, from ``/proc/cpuinfo`` when there is one), torch's intra- and inter-op thread counts and the
thread variables of the environment (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ``MKL_NUM_THREADS``), the
device, the git commit and `code_version`. `workbench.train.run` adds each agent's starting-weights digest
(``start_weights``) once the agents are loaded.

`code_version` hashes the workbench's own source files and the tiny zoo's recipe version: two runs with the
same config but different code (or zoo) get different versions, so a finished run is never silently reused
after the code changed, and aggregation across seeds can refuse to average runs of different code.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.agents.zoo import ZOO_VERSION

_ENV_PACKAGES = (
    "torch", "transformers", "peft", "bitsandbytes", "tokenizers", "safetensors", "numpy", "pandas",
    "math-verify", "reasoning-gym", "altair", "papermill", "hacpo-workbench",
)  # fmt: skip

SIMD_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimdhp", "bf16", "i8mm", "sve",
    "sve2",
)  # fmt: skip
"""CPU flags that change which float kernels torch and oneDNN pick (x86 ``flags``, Arm ``Features``)."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")
"""Environment variables that set or tune the CPU thread pools."""


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def cpu_info(cpuinfo: str | None) -> dict[str, Any]:
    """The CPU's model name and which of `SIMD_FLAGS` it has, from the text of ``/proc/cpuinfo``.

    Args:
        cpuinfo: The file's text, or None where there is none (macOS, Windows): the model is then
            ``platform.processor()`` and the flags None (unknown).

    Returns:
        ``{"model": str | None, "logical_cores": int | None, "simd": [flag, ...] | None}``.
    """
    fields: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in fields:  # the first processor speaks for all
            fields[key.strip()] = value.strip()
    model = fields.get("model name") or fields.get("Model") or fields.get("Hardware")
    flags = fields.get("flags", fields.get("Features"))
    return {
        "model": model or (None if cpuinfo is not None else platform.processor() or None),
        "logical_cores": os.cpu_count(),
        "simd": None if flags is None else [f for f in SIMD_FLAGS if f in set(flags.split())],
    }


def _read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


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


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A 12-hex-digit hash of every ``workbench/**/*.py`` file (path and bytes) and the zoo's recipe version.

    Stable across machines and checkouts of the same source; independent of git (works in a wheel install
    and with uncommitted edits, which it counts). Computed once per process.
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"zoo={ZOO_VERSION}\n".encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def collect_environment() -> dict[str, Any]:
    """Python, platform, package versions, CPU, thread settings, device, git commit (None outside a git
    checkout), code version and start time."""
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
        "cpu": cpu_info(_read_cpuinfo()),
        "thread_variables": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        **_device_info(),
        "code_version": code_version(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }
