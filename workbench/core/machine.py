"""What a computation ran on: the CPU and its SIMD flags, thread settings, library versions; and which code.

Two CPUs that differ in these flags (AVX2 vs AVX-512 vs AMX) run different float kernels, so a long float
computation (a warm start of hundreds of optimizer steps) ends in different weights. Cards of shipped agents
(``built_on``) and run records (``environment.json``) carry these facts so a reader can tell why two numbers
differ. `code_version` names the workbench's own source (part of a run's identity). Standard library only
(torch is imported where thread counts are asked for).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

__all__ = [
    "LIBRARIES",
    "SIMD_FLAGS",
    "THREAD_VARIABLES",
    "code_version",
    "cpu_info",
    "library_versions",
    "machine_info",
    "read_cpuinfo",
    "thread_settings",
]

SIMD_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimdhp", "bf16", "i8mm", "sve",
    "sve2",
)  # fmt: skip
"""CPU flags that change which float kernels torch and oneDNN pick (x86 ``flags``, Arm ``Features``)."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")
"""Environment variables that set or tune the CPU thread pools."""
LIBRARIES = (
    "torch", "transformers", "peft", "bitsandbytes", "tokenizers", "safetensors", "numpy", "pandas",
    "math-verify", "reasoning-gym", "altair", "papermill", "hacpo-workbench",
)  # fmt: skip
"""Packages whose versions a record lists."""


def read_cpuinfo() -> str | None:
    """The text of ``/proc/cpuinfo``, or None where there is none (macOS, Windows)."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_info(cpuinfo: str | None) -> dict[str, Any]:
    """The CPU's model name and which of `SIMD_FLAGS` it has, from the text of ``/proc/cpuinfo``.

    Args:
        cpuinfo: The file's text (`read_cpuinfo`), or None where there is none: the model is then
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


def library_versions() -> dict[str, str | None]:
    """Installed version of each of `LIBRARIES` (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def thread_settings() -> dict[str, Any]:
    """The environment's thread variables (`THREAD_VARIABLES`)."""
    return {name: os.environ.get(name) for name in THREAD_VARIABLES}


def machine_info() -> dict[str, Any]:
    """CPU, torch's thread counts, thread variables and library versions in one record (shipped cards)."""
    import torch

    return {
        "cpu": cpu_info(read_cpuinfo()),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "thread_variables": thread_settings(),
        "packages": library_versions(),
    }


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A 12-hex-digit hash of every ``workbench/**/*.py`` file (path and bytes).

    Two runs with the same config but different code get different versions, so a finished run is never
    silently reused after the code changed, and aggregation across seeds can refuse to average runs of
    different code. The tiny zoo's recipe version (``ZOO_VERSION`` in ``workbench/agents/models/zoo.py``) is
    part of the source, so it counts too. Stable across machines and checkouts of the same source; independent
    of git (works in a wheel install and with uncommitted edits, which it counts). Computed once per process.
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
