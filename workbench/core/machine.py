"""What a computation ran on: CPU model and the SIMD flags that change float kernels, threads, versions.

Two CPUs that differ in these flags (AVX2 vs AVX-512 vs AMX) run different matmul kernels, so long float
computations (a warm start of hundreds of steps) end in different weights. Cards of shipped agents and run
records carry `machine_info` so a reader can tell why two numbers differ.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["KERNEL_FLAGS", "cpu_info", "library_versions", "machine_info"]

KERNEL_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_tile",
)
"""CPU flags (``/proc/cpuinfo`` names) that select different torch/oneDNN kernels."""

LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "tokenizers", "safetensors", "numpy")


def cpu_info() -> dict[str, Any]:
    """CPU model name, logical CPU count and which of `KERNEL_FLAGS` it has (Linux; else the platform)."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "flags": [flag for flag in KERNEL_FLAGS if flag in flags],
    }


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries whose kernels or defaults change numbers (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def machine_info() -> dict[str, Any]:
    """`cpu_info`, torch's thread settings and `library_versions` in one record."""
    import torch

    return {
        "cpu": cpu_info(),
        "threads": {
            "torch": torch.get_num_threads(),
            "torch_interop": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        },
        "versions": library_versions(),
    }
