"""Checkpoints that survive a kill at any instant, and the RNG states that make a resume exact.

Layout inside a run directory::

    checkpoints/
      step_000010/            one finished checkpoint
        <key>.pt              one torch.save file per top-level key of the saved state
        manifest.json         step, format version, every file's size and sha256 -- written LAST
      step_000020/
      latest                  text: "step_000020" (a hint; loading does not trust it)
      .tmp-step_000030-x1y2/  a checkpoint being written (or left by a kill; removed on the next save/load)

Why this is safe: a checkpoint is built in a ``.tmp-*`` directory and renamed into place only once complete,
and its manifest is the last file written, so a step directory without a valid manifest, or whose files do
not match it byte for byte, is partial or damaged. `load_latest_checkpoint` verifies before it unpickles,
logs a WARNING naming the directory and the defect, and falls back to the next older checkpoint.

Why loading one cannot run code: the manifest vouches for the bytes, not for who wrote them, and run
directories are passed around. Every file is read with ``torch.load(weights_only=True)``, whose unpickler
builds tensors, containers and plain values only; what a checkpoint holds is saved in those forms (the numpy
RNG state as plain values: `capture_rng_state`). Checkpoints written before that held numpy's state as an
array: the few numpy types that rebuild such an array are allowed (`NUMPY_RNG_GLOBALS`), so they resume as
they are. Anything else (a pickled callable, an unknown class) is refused before it is built:
`UnsafeCheckpointError` names the file and what it asked for, and nothing of the checkpoint is used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from workbench.core import io as wio
from workbench.core.storage import UnsafeCheckpointError

__all__ = [
    "FORMAT_VERSION",
    "NUMPY_RNG_GLOBALS",
    "UnsafeCheckpointError",
    "capture_rng_state",
    "last_good_checkpoint",
    "list_checkpoints",
    "load_latest_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "tensor_bytes",
    "verify_checkpoint",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


def _numpy_rng_globals() -> list[Any]:
    try:
        import numpy as np
    except ImportError:
        return []
    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), np._core.multiarray._reconstruct]


NUMPY_RNG_GLOBALS = _numpy_rng_globals()
"""What rebuilds the numpy RNG array of a checkpoint written before that state was saved as plain values: the
only globals the loader allows besides torch's own."""
_STEP_DIR_RE = re.compile(r"^step_(\d{6,})$")
_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_TMP_PREFIX = ".tmp-"
_CHUNK = 1 << 20


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _checkpoints_root(run_dir: Path | str) -> Path:
    return Path(run_dir) / "checkpoints"


def _remove_stale_tmp(root: Path) -> None:
    """Remove ``.tmp-*`` directories: a checkpoint never finished (the process was killed mid-save)."""
    for path in root.glob(_TMP_PREFIX + "*"):
        logger.warning("removing an unfinished checkpoint left behind by an interrupted save: %s", path)
        shutil.rmtree(path, ignore_errors=True)


def list_checkpoints(run_dir: Path | str) -> list[tuple[int, Path]]:
    """``(step, dir)`` of every ``checkpoints/step_*`` directory, oldest first, valid or not."""
    root = _checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        m = _STEP_DIR_RE.match(path.name)
        if m and path.is_dir():
            found.append((int(m.group(1)), path))
    return sorted(found)


def _validate_save_args(step: int, state: dict[str, object], keep_last: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: step must be a non-negative int, got {step!r}")
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"save_checkpoint: keep_last must be an int >= 1, got {keep_last!r}")
    if not isinstance(state, dict) or not state:
        raise ValueError("save_checkpoint: state must be a non-empty dict of name -> object")
    for key in state:
        if not isinstance(key, str) or not _KEY_RE.match(key) or key == "manifest":
            raise ValueError(
                f"save_checkpoint: state key {key!r} is not usable as a file name; use letters, digits, "
                "_ . - (not starting with . or -, and not 'manifest')"
            )


def save_checkpoint(run_dir: Path | str, step: int, state: dict[str, object], *, keep_last: int = 2) -> Path:
    """Write ``checkpoints/step_{step:06d}/`` atomically, point ``latest`` at it, prune old ones.

    Args:
        run_dir: The run directory.
        step: Training step the state belongs to (the number of completed steps).
        state: Name -> object (state dicts, tensors, plain python objects); one ``<name>.pt`` file each.
        keep_last: How many checkpoints with a step <= ``step`` to keep, this one included. Checkpoints of
            later steps (left by an abandoned trajectory) are never pruned here.

    Returns:
        The checkpoint directory.

    Raises:
        ValueError: A bad step, keep_last, or state key (names it and what is allowed).
        OSError: A write failed (disk full, read-only, ...): it names the checkpoint; nothing of the new
            checkpoint is left behind and the older ones are untouched (pruning comes after success).
    """
    _validate_save_args(step, state, keep_last)
    root = _checkpoints_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    name = f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}-", dir=root))
    try:
        files = {}
        for key, value in state.items():
            path = tmp / f"{key}.pt"
            _save_file(value, path, name=root / name)
            # Hash what is on disk (not what we meant to write): verification compares against this.
            files[key] = {"file": path.name, "bytes": path.stat().st_size, "sha256": _sha256_file(path)}
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "files": files,
        }
        wio.atomic_write_json(tmp / "manifest.json", manifest)  # last: its presence marks completeness
        wio.fsync_dir(tmp)
        final = root / name
        if final.exists():
            # Re-saving a step (resumed from an earlier checkpoint): move the old one aside first; if
            # killed in between, the old copy is a .tmp-* dir (cleaned later) and older checkpoints remain.
            shutil.rmtree(final.rename(root / f"{_TMP_PREFIX}old-{name}-{os.getpid()}"))
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    wio.fsync_dir(root)
    wio.atomic_write_text(root / "latest", name + "\n")
    _prune(run_dir, step, keep_last)
    logger.info("saved checkpoint %s", final)
    return final


def _save_file(value: object, path: Path, *, name: Path) -> None:
    """``torch.save`` into ``path`` + fsync; a failed write raises an `OSError` naming the checkpoint.

    torch reports a write that failed (disk full) as ``RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos``, with the `OSError` only as its context: that `OSError` is what is raised instead. A
    Ctrl-C inside the write turns into the same ``RuntimeError``: it is raised as the `KeyboardInterrupt`
    it was.
    """
    try:
        with open(path, "wb") as f:
            torch.save(value, f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(name)) from err
    except RuntimeError as err:
        cause = err.__context__
        if isinstance(cause, OSError) and cause.errno is not None:
            raise OSError(cause.errno, cause.strerror, str(name)) from err
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from err
        raise


def tensor_bytes(obj: object) -> int:
    """Bytes of every tensor in a nested state (dicts, lists, tuples): about what ``torch.save`` writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def last_good_checkpoint(run_dir: Path | str) -> tuple[int, Path] | None:
    """``(step, dir)`` of the newest checkpoint that passes `verify_checkpoint` (nothing is unpickled)."""
    for step, path in reversed(list_checkpoints(run_dir)):
        if verify_checkpoint(path) is None:
            return step, path
    return None


def _prune(run_dir: Path | str, step: int, keep_last: int) -> None:
    older = [path for s, path in list_checkpoints(run_dir) if s < step]
    for path in older[: max(0, len(older) - (keep_last - 1))]:
        # Rename first: a kill mid-delete then leaves a .tmp-* dir (cleaned later), not a half step dir.
        shutil.rmtree(path.rename(path.parent / f"{_TMP_PREFIX}pruned-{path.name}"), ignore_errors=True)
        logger.info("pruned checkpoint %s (keep_last=%d)", path, keep_last)


def verify_checkpoint(ckpt_dir: Path | str) -> str | None:
    """Check a checkpoint directory against its manifest without unpickling anything.

    Returns:
        None when it is complete and intact, else a short description of what is wrong.
    """
    ckpt_dir = Path(ckpt_dir)
    manifest_path = ckpt_dir / "manifest.json"
    if not manifest_path.is_file():
        return "manifest.json is missing (the save was interrupted)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        version, step = manifest["format_version"], manifest["step"]
    except (ValueError, KeyError, TypeError) as err:
        return f"manifest.json is unreadable: {type(err).__name__}: {err}"
    if version != FORMAT_VERSION:
        return f"manifest format_version {version!r} is not the supported {FORMAT_VERSION}"
    m = _STEP_DIR_RE.match(ckpt_dir.name)
    if m and int(m.group(1)) != step:
        return f"manifest step {step} does not match the directory name"
    try:
        for key, entry in files.items():
            problem = _verify_file(ckpt_dir, key, entry)
            if problem:
                return problem
    except (AttributeError, KeyError, TypeError) as err:
        return f"manifest.json is malformed: {type(err).__name__}: {err}"
    return None


def _verify_file(ckpt_dir: Path, key: str, entry: dict[str, Any]) -> str | None:
    path = ckpt_dir / entry["file"]
    if not path.is_file():
        return f"file {entry['file']} (state key {key!r}) is missing"
    size = path.stat().st_size
    if size != entry["bytes"]:
        return f"file {entry['file']} has {size} bytes, manifest says {entry['bytes']} (truncated?)"
    if _sha256_file(path) != entry["sha256"]:
        return f"file {entry['file']} fails its sha256 check (corrupted)"
    return None


def load_latest_checkpoint(
    run_dir: Path | str, *, map_location: str | torch.device = "cpu"
) -> tuple[int, dict[str, Any]] | None:
    """Load the newest intact checkpoint of a run.

    Candidates are tried newest step first (the ``latest`` pointer is not trusted: it can lag behind or
    point at a damaged directory). Each is verified against its manifest (presence, sizes, sha256); a bad
    one is skipped with a WARNING naming it and the defect, and the next older one is tried.

    Files are unpickled with ``torch.load(weights_only=True)`` (tensors, containers, plain values, and the
    numpy types of `NUMPY_RNG_GLOBALS`): a file that asks for anything else is refused unbuilt.

    Args:
        run_dir: The run directory.
        map_location: Where tensors are loaded (default CPU; optimizers and models move them on load).

    Returns:
        ``(step, state)`` with the same keys that were saved, or None when no intact checkpoint exists.

    Raises:
        UnsafeCheckpointError: An intact checkpoint holds something the safe unpickler refuses (names it); it
            is not loaded, and no older one is tried in its place.
    """
    root = _checkpoints_root(run_dir)
    if not root.is_dir():
        return None
    _remove_stale_tmp(root)
    for step, path in reversed(list_checkpoints(run_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            try:
                manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
                state = {
                    key: _safe_load(path / entry["file"], map_location)
                    for key, entry in manifest["files"].items()
                }
            except UnsafeCheckpointError:
                raise
            except Exception as err:  # verified bytes that still fail to unpickle: skip, never crash
                problem = f"failed to load: {type(err).__name__}: {err}"
        if problem is not None:
            logger.warning("skipping checkpoint %s: %s", path, problem)
            continue
        logger.info("loaded checkpoint %s", path)
        return step, state
    return None


def _safe_load(path: Path, map_location: str | torch.device) -> Any:
    """``torch.load`` with the weights-only unpickler (`NUMPY_RNG_GLOBALS` allowed too)."""
    try:
        with torch.serialization.safe_globals(NUMPY_RNG_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        refused = re.search(r"GLOBAL (\S+) was not an allowed global", str(err))
        if refused is None:  # not a pickled object at all (garbage bytes): an unloadable file, not a threat
            raise
        raise UnsafeCheckpointError(
            f"checkpoint file {path} was refused: it asks to call or build {refused.group(1)}, beyond "
            "tensors and plain values. Loading it could run code, so nothing of this checkpoint was used; a "
            "checkpoint received from elsewhere should be deleted, or its run started afresh"
        ) from None


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states: python ``random``, numpy (when importable), torch CPU, and CUDA if available.

    Everything is a tensor or a plain value (numpy's state: its name, its key as a list of ints, position
    and Gaussian cache), so the weights-only unpickler loads it. Generators a caller creates itself
    (``torch.Generator``, ``numpy.random.default_rng``) are not global: checkpoint those with their owner.
    """
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, key, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (str(kind), [int(k) for k in key], int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what `capture_rng_state` captured. A part this machine cannot restore (numpy missing,
    CUDA state on a CPU-only machine) is skipped with a warning."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            logger.warning("restore_rng_state: numpy state present but numpy is not importable; skipped")
        else:
            kind, key, pos, has_gauss, cached = state["numpy"]  # a key saved as a list, or as an array
            np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            logger.warning(
                "restore_rng_state: saved CUDA RNG state for %d device(s) cannot be restored here; skipped",
                len(state["cuda"]),
            )
