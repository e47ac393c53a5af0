"""Atomic file helpers: every file the workbench writes goes through here.

A run may be killed at any instant (Ctrl-C, OOM killer, a pre-empted job). Two rules keep its directory
readable afterwards:

- whole files (configs, CSV tables, sample dumps, checkpoints) are written to a temporary file in the same
  directory, flushed, fsync'ed, then moved over the target with ``os.replace`` (atomic on POSIX): a reader
  sees either the old file or the new one, never half of each;
- append-only logs (``metrics.jsonl``) get one ``write`` per line followed by flush + fsync, so a kill can
  leave at most one truncated last line. `read_jsonl` drops it with a warning and `append_jsonl` repairs
  it before appending, so the next line never gets glued onto a fragment.

A failed write raises an `OSError` that names the file being written (``os.write`` and ``fsync`` errors carry
no file name by themselves), so `workbench.core.storage.as_storage_error` can name it to the user.

JSON here is Python's dialect: ``NaN`` and ``Infinity`` are written as such (lossless for metrics such as
an undefined ω), which `json.loads` and pandas read back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

_TAIL_BLOCK = 1 << 16


def fsync_dir(path: Path | str) -> None:
    """Flush a directory entry to disk (best effort: some filesystems refuse ``fsync`` on directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path | str, write: Callable[[Any], None]) -> None:
    """Create a temp file beside ``path``, let ``write(fileobj)`` fill it, fsync, then ``os.replace``."""
    path = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _naming(err, path)  # noqa: B904 (chained in _naming when new)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException as err:
        # Whatever failed (disk full, a bad object, KeyboardInterrupt), leave no temp litter behind.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(err, OSError):
            raise _naming(err, path)  # noqa: B904 (chained in _naming when new)
        raise
    fsync_dir(path.parent)


def _naming(err: OSError, path: Path | str) -> OSError:
    """The same error naming ``path`` when ``err`` names no file (raise it ``from err``); else ``err``."""
    if err.filename is not None or err.errno is None:
        return err
    named = type(err)(err.errno, err.strerror, str(path))
    named.__cause__ = err
    return named


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + fsync + ``os.replace``).

    Args:
        path: Target file; its directory must exist.
        data: The complete new content.
    """
    _atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (``NaN``/``Infinity`` allowed)."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def atomic_write_yaml(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as block-style YAML to ``path`` atomically, keeping the key order."""
    text = yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, allow_unicode=True)
    atomic_write_text(path, text)


def _last_newline_offset(f: Any, size: int) -> int:
    """Offset of the last ``\\n`` in an open binary file of ``size`` bytes, or -1."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        f.seek(start)
        block = f.read(end - start)
        idx = block.rfind(b"\n")
        if idx >= 0:
            return start + idx
        end = start
    return -1


def _repair_tail(path: Path) -> None:
    """Make sure an existing JSONL file ends with a newline before appending to it.

    A last line without its newline is either a complete record whose newline never got written (keep it,
    add the newline) or the fragment of a killed write (truncate it away, with a warning).
    """
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "r+b") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        cut = _last_newline_offset(f, size) + 1
        f.seek(cut)
        tail = f.read()
        if isinstance(_try_parse(tail), dict):
            f.seek(size)
            f.write(b"\n")
        else:
            logger.warning("%s: dropping a partial last line (%d bytes) before appending", path, size - cut)
            f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())


def _try_parse(raw: bytes | str) -> Any:
    """``json.loads`` that returns None instead of raising."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def append_jsonl(path: Path | str, row: dict[str, Any]) -> None:
    """Append one JSON object as one line, then flush + fsync.

    The line is written with a single ``write`` call, so a kill leaves at most a partial last line, which
    the next `append_jsonl` (or `read_jsonl`) handles.

    Args:
        path: The JSONL file (created if missing; its directory must exist).
        row: A JSON-serialisable dict.

    Raises:
        TypeError: ``row`` is not a dict or holds values JSON cannot encode.
    """
    if not isinstance(row, dict):
        raise TypeError(f"append_jsonl({path}): row must be a dict, got {type(row).__name__}")
    path = Path(path)
    line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")  # encode before touching the file
    try:
        if path.exists():
            _repair_tail(path)
        with open(path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise _naming(err, path)  # noqa: B904 (chained in _naming when new)


def read_jsonl(path: Path | str, *, skip_partial_last: bool = True) -> list[dict[str, Any]]:
    """Read a JSONL file of objects; blank lines are ignored.

    Args:
        path: The file to read.
        skip_partial_last: Drop an unparseable LAST line (what a kill mid-append leaves) with a logged
            warning. When False it raises like any other bad line.

    Returns:
        The parsed rows, in file order.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: A line other than the last is not a JSON object (names the file and the 1-based line).
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    rows: list[dict[str, Any]] = []
    for pos, (lineno, raw) in enumerate(numbered):
        obj = _try_parse(raw)
        if isinstance(obj, dict):
            rows.append(obj)
            continue
        if skip_partial_last and pos == len(numbered) - 1:
            logger.warning("%s: skipping a partial last line %d (%d bytes)", path, lineno, len(raw))
            continue
        snippet = raw[:80].decode("utf-8", errors="replace")
        raise ValueError(f"{path}: line {lineno} is not a JSON object: {snippet!r}")
    return rows


def truncate_jsonl(path: Path | str, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Atomically rewrite a JSONL file keeping only the rows for which ``keep(row)`` is true.

    Used on resume to drop the metrics of steps after the checkpoint. A partial last line is dropped too.

    Args:
        path: The JSONL file; a missing file is left missing.
        keep: Predicate on a parsed row.

    Returns:
        The number of rows dropped (a dropped partial line does not count).
    """
    path = Path(path)
    if not path.exists():
        return 0
    rows = read_jsonl(path)
    kept = [row for row in rows if keep(row)]
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept))
    return len(rows) - len(kept)


# ---------------------------------------------------------------- conversion to plain data


def _is_scalar_array(value: Any) -> bool:
    """A numpy scalar/0-d array or a one-element torch tensor (anything with ``.item()`` and one element)."""
    if not hasattr(value, "item"):
        return False
    size = getattr(value, "size", None)
    numel = value.numel() if hasattr(value, "numel") else (size if isinstance(size, int) else None)
    return numel == 1


def to_float(value: Any, name: str) -> float:
    """Convert a metric value (python/numpy number, one-element tensor or array, bool) to ``float``.

    Raises:
        TypeError: Anything else (names ``name``, the type and what is allowed).
    """
    if isinstance(value, bool | int | float):
        return float(value)
    if _is_scalar_array(value):
        item = value.item()
        if isinstance(item, bool | int | float):
            return float(item)
    raise TypeError(
        f"{name}: expected a number (int, float, numpy scalar, one-element tensor), "
        f"got {type(value).__name__}: {value!r:.80}"
    )


def to_plain(obj: Any, where: str = "config") -> Any:
    """Convert a config to plain YAML/JSON data: dicts with str keys, lists, str, int, float, bool, None.

    Tuples become lists, paths strings, numpy/torch scalars python numbers, so the config reads back from
    YAML equal to what was written (and hashes the same, see ``config_hash`` in `workbench.lab.frames`).

    Raises:
        TypeError: A value of another type, or a non-str key (names its dotted path, such as
            ``config.agents[1].lr``).
    """
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be str, got {key!r} ({type(key).__name__})")
            out[key] = to_plain(value, f"{where}.{key}")
        return out
    if isinstance(obj, list | tuple):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, Path):
        return str(obj)
    if _is_scalar_array(obj):
        return obj.item()
    raise TypeError(
        f"{where}: {type(obj).__name__} is not plain data (allowed: dict, list, tuple, str, int, float, "
        "bool, None, Path, numpy/torch scalars)"
    )


def to_jsonable(obj: Any) -> Any:
    """Like `to_plain` but lenient, for logs (samples, summaries): arrays/tensors become lists, dataclasses
    dicts, and anything else unknown its ``str``."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "tolist"):
        return to_jsonable(obj.tolist())
    return str(obj)
