"""One writer per directory: an exclusive lock that names its holder and is taken over when its holder died.

The lock is `filelock.FileLock` (``flock(2)`` on an open lock file): the kernel releases it when the holding
process ends in any way, ``kill -9`` included, so a lock is never left held by a dead process. What a dead
holder leaves is its record: the lock file holds the holder's pid, host, start time and command as JSON while
the lock is held, and is emptied on a clean release. So:

- a second process that tries to take a held lock stops at once with a `RunLockedError` naming the holder;
- a process that takes a lock whose record is still there knows the previous holder died without releasing it
  (a stale lock) and says so in a WARNING before it writes its own record.

Standard library and filelock only.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import filelock

from workbench.core.storage import STORAGE_FAILURES, StorageError, as_storage_error

__all__ = ["DirectoryLock", "RunLockedError", "describe_holder", "read_holder"]

logger = logging.getLogger(__name__)

_COMMAND_CHARS = 100  # of the holder's command line, in messages
_READ_TRIES = 10  # a contender may read the record while the holder is writing it: retry briefly


class RunLockedError(RuntimeError):
    """Another process (or another call in this one) holds the lock.

    Attributes:
        lock_path: The lock file.
        holder: The holder's record (``pid``, ``host``, ``started``, ``command``), or None if unreadable.
    """

    def __init__(self, message: str, lock_path: Path, holder: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.lock_path, self.holder = lock_path, holder


def _this_holder() -> dict[str, Any]:
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("workbench", "__main__.py")):
        argv[0] = "python -m workbench"  # what the user typed, not the module's path
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(argv) or sys.executable,
    }


def _parse_holder(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None


def read_holder(lock_path: Path | str) -> dict[str, Any] | None:
    """The holder record in a lock file, or None when it is missing, empty (released) or unreadable."""
    for attempt in range(_READ_TRIES):
        try:
            raw = Path(lock_path).read_bytes()
        except OSError:
            return None
        if not raw.strip():
            return None
        record = _parse_holder(raw)
        if record is not None or attempt == _READ_TRIES - 1:
            return record
        time.sleep(0.05)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def describe_holder(holder: dict[str, Any]) -> str:
    """``"pid 123 on host gpu-2 since 2026-12-03T10:00:00+00:00 (python -m workbench run q.yaml)"``."""
    text = f"pid {holder.get('pid')} on host {holder.get('host', '?')} since {holder.get('started', '?')}"
    command = str(holder.get("command") or "")
    if len(command) > _COMMAND_CHARS:
        command = command[: _COMMAND_CHARS - 3] + "..."
    return f"{text} ({command})" if command else text


class DirectoryLock:
    """An exclusive, non-reentrant lock on a directory, recording its holder inside the lock file.

    Two `DirectoryLock` objects on the same directory exclude each other even within one process (a notebook
    that starts the same run twice), and across processes and hosts as far as the filesystem's ``flock`` goes.

    Args:
        directory: The directory to lock (it must exist).
        name: The lock file's name inside it.
        what: How messages call the directory ("run directory").
        remedy: What a refused caller can do, appended to `RunLockedError`'s message.
    """

    def __init__(
        self, directory: Path | str, name: str, *, what: str = "directory", remedy: str = ""
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self.what, self.remedy = what, remedy
        self.previous: dict[str, Any] | None = None
        self._lock = filelock.FileLock(self.path, thread_local=False, on_acquired=self._write_record)

    def _write_record(self, fd: int) -> None:
        """Called by filelock with the locked descriptor: note a stale record, then write ours."""
        self.previous = _parse_holder(os.pread(fd, 4096, 0))
        data = json.dumps(_this_holder()).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._lock.is_locked

    def acquire(self, timeout: float = 0.0) -> DirectoryLock:
        """Take the lock, waiting at most ``timeout`` seconds (0: fail at once if it is held).

        Returns:
            self (so ``with DirectoryLock(...).acquire(): ...`` works).

        Raises:
            RunLockedError: Another holder has it (the message names it and the remedy).
            StorageError: The lock file cannot be created (read-only, permission denied, no space) or the
                filesystem has no file locks.
        """
        try:
            self._lock.acquire(timeout=timeout)
        except filelock.Timeout:
            raise self._locked_error() from None
        except OSError as err:
            if err.errno in (errno.ENOSYS, errno.EOPNOTSUPP):  # flock(2) unsupported here: no locks at all
                raise StorageError(errno.ENOLCK, self.path, *STORAGE_FAILURES[errno.ENOLCK]) from err
            storage = as_storage_error(err, self.path)
            if storage is None:
                raise
            raise storage from err
        if self.previous is not None:
            prev = self.previous
            gone = prev.get("host") != socket.gethostname() or not _pid_alive(int(prev["pid"]))
            logger.warning(
                "taking over the stale lock of %s %s: its holder, %s, ended without releasing it%s",
                self.what,
                self.directory,
                describe_holder(prev),
                " (killed?)" if gone else " (that pid now belongs to another process)",
            )
        return self

    def _locked_error(self) -> RunLockedError:
        holder = read_holder(self.path)
        if holder is None:
            who = f"another process (its record in {self.path} is empty or unreadable)"
        elif holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid():
            who = f"this process ({describe_holder(holder)}): another run of it in this kernel or thread"
        else:
            who = describe_holder(holder)
            if holder.get("host") == socket.gethostname() and not _pid_alive(int(holder["pid"])):
                who += (
                    f"; that pid is no longer running, so a process it started still has the lock file "
                    f"open (find it with `fuser {self.path}`)"
                )
        text = f"{self.what} {self.directory} is locked by {who}."
        return RunLockedError(f"{text} {self.remedy}".strip(), self.path, holder)

    def release(self) -> None:
        """Empty the record (a clean release leaves no stale holder behind) and release the lock."""
        if not self._lock.is_locked:
            return
        try:
            os.truncate(self.path, 0)
        except OSError as err:  # the lock still goes; the next holder will call this record stale
            logger.warning("could not clear the lock record %s: %s", self.path, err)
        self._lock.release()

    def __enter__(self) -> DirectoryLock:
        return self if self.held else self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
