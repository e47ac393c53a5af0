"""Agents that ship inside the repository, so every machine starts from the same weights.

A warm start trained on one CPU is not reproduced bit for bit on another (matmul kernels differ between
AVX2, AVX-512 and AMX machines, and the difference grows over hundreds of optimizer steps). So the weights
themselves are committed under ``zoo/`` at the project root, one folder per agent, with ``zoo/MANIFEST.json``
holding the size and sha256 of every file and each agent's card (accuracy, steps, build time, the machine it
was built on):

| folder | what | loaded by |
|---|---|---|
| ``zoo/tiny/<preset>/`` | a tiny agent: config, weights, tokenizer, ``card.json`` | ``tiny:<preset>`` |
| ``zoo/warm/<name>/`` | a LoRA warm start of an embedded model: adapter, ``card.json`` | ``warm:<name>`` |

Every load checks the files against the manifest (`shipped_dir`); a mismatch (a partial checkout, a Git LFS
pointer, an edited file) is a named error, never silently different weights. ``python -m workbench zoo
build NAME`` rebuilds an agent on this machine and reports how far it lands from the shipped card;
``--ship`` replaces the shipped files with the rebuild (`ship`).

Standard library only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from workbench.core.io import atomic_write_json
from workbench.core.paths import PROJECT_ROOT

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
