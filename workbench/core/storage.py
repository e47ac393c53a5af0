"""Storage failures named for a person: which path, what failed, what to do; and checks before a run starts.

A full disk, a read-only results root, a directory without write permission or a file where a directory
should be all surface as an `OSError` somewhere deep in a write (``torch.save`` even hides it behind a
``RuntimeError`` about an "unexpected pos", which `workbench.train.checkpoint` unwraps). `as_storage_error`
turns the ones a person can fix into a `StorageError` whose message names the path, the failure and the
remedy; the command line exits with code 2 on it. `ensure_writable_dir` and `check_free_space` find the
same problems before any model is loaded or any step is trained.

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "STORAGE_FAILURES",
    "StorageError",
    "UnsafeCheckpointError",
    "as_storage_error",
    "check_free_space",
    "ensure_writable_dir",
    "format_bytes",
]


class UnsafeCheckpointError(RuntimeError):
    """A stored checkpoint file asks the unpickler for something other than tensors and plain values (a
    function, a class): refused without being built (`workbench.train.checkpoint`); the command line exits
    with code 2 on it."""


_ELSEWHERE = "or choose another results root (--set output.root=PATH, or output.root in the config)"
STORAGE_FAILURES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device", f"free space on that filesystem, {_ELSEWHERE}"),
    errno.EDQUOT: ("disk quota exceeded", f"free space within your quota, {_ELSEWHERE}"),
    errno.EACCES: ("permission denied", f"make it writable for this user (chmod/chown), {_ELSEWHERE}"),
    errno.EPERM: ("operation not permitted", f"make it writable for this user (chmod/chattr), {_ELSEWHERE}"),
    errno.EROFS: ("the filesystem is read-only", f"remount it read-write, {_ELSEWHERE}"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", f"move that file away, {_ELSEWHERE}"),
    errno.EEXIST: ("the path exists as a file, not a directory", f"move that file away, {_ELSEWHERE}"),
    errno.EISDIR: ("the path is a directory, not a file", f"move that directory away, {_ELSEWHERE}"),
    errno.ENOLCK: (
        "the filesystem offers no file locks",
        f"put the results root on a filesystem with file locks (flock), such as a local disk, {_ELSEWHERE}",
    ),
}
"""errno -> (what failed, the remedy) for the storage failures a person can fix; others stay as they are."""


class StorageError(OSError):
    """A write failed for a reason a person can fix (see `STORAGE_FAILURES`); the message says what to do.

    Attributes:
        path: The path that could not be written (or the file standing where a directory should be).
        failure: What failed, in words ("no space left on the device").
        remedy: What to do about it.
    """

    def __init__(self, code: int, path: Path | str, failure: str, remedy: str, note: str = "") -> None:
        super().__init__(code, failure, str(path))
        self.path, self.failure, self.remedy, self.note = Path(path), failure, remedy, note

    def __str__(self) -> str:
        text = f"cannot write {self.path}: {self.failure}. Remedy: {self.remedy}."
        return f"{text} {self.note}" if self.note else text

    def with_note(self, note: str) -> StorageError:
        """The same error with ``note`` appended to its message (e.g. which checkpoint is still good)."""
        return StorageError(self.errno, self.path, self.failure, self.remedy, note)


def as_storage_error(err: BaseException, path: Path | str | None = None) -> StorageError | None:
    """The `StorageError` for ``err`` when it is a storage failure a person can fix, else None.

    Args:
        err: Any exception; an `OSError` with an errno of `STORAGE_FAILURES` qualifies.
        path: The path to name when ``err`` carries none.
    """
    if isinstance(err, StorageError):
        return err
    if not isinstance(err, OSError) or err.errno not in STORAGE_FAILURES:
        return None
    failure, remedy = STORAGE_FAILURES[err.errno]
    where = err.filename if err.filename is not None else path
    if err.errno == errno.ENOSPC and where is not None:
        free = _free_bytes(Path(where))
        if free is not None:
            failure += f" ({format_bytes(free)} free there now)"
    return StorageError(err.errno, where if where is not None else "(unknown path)", failure, remedy)


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KB"`` (powers of 1024, one decimal)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (its nearest existing ancestor), or None."""
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            if candidate.exists():
                return shutil.disk_usage(candidate).free
    return None


def ensure_writable_dir(path: Path | str) -> Path:
    """Create ``path`` (and its parents) if needed and prove that a file can be written in it.

    Args:
        path: The directory (a results root, an experiment directory).

    Returns:
        ``path``.

    Raises:
        StorageError: A part of the path is a file, or creating the directory or a probe file inside it
            failed with a storage failure (read-only, permission denied, out of space).
    """
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                _, remedy = STORAGE_FAILURES[errno.ENOTDIR]
                raise StorageError(
                    errno.ENOTDIR, part, f"it is a file, not a directory (needed: {path})", remedy
                )
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        storage = as_storage_error(err, path)
        if storage is None:
            raise
        raise storage from err
    return path


def check_free_space(path: Path | str, needed: int, what: str) -> int:
    """Refuse to start when the filesystem of ``path`` has less than ``needed`` bytes free.

    Args:
        path: An existing directory on the filesystem to check.
        needed: Bytes that must be free.
        what: What the bytes are for, for the message ("one checkpoint of this run (3.4 MB) + 8 MB margin").

    Returns:
        The free bytes.

    Raises:
        StorageError: Not enough free space (ENOSPC), naming the path, both amounts and the remedy.
    """
    free = shutil.disk_usage(path).free
    if free < needed:
        _, remedy = STORAGE_FAILURES[errno.ENOSPC]
        failure = f"only {format_bytes(free)} free, but {what} needs {format_bytes(needed)}"
        raise StorageError(errno.ENOSPC, path, failure, remedy)
    return free
