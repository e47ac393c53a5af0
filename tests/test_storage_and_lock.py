"""Storage failures named (workbench.core.storage, io, checkpoint) and one writer per directory (core.lock).

No models here: the training-level drills are in tests/test_reliability.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from workbench.core import io as wio
from workbench.core import storage
from workbench.core.lock import DirectoryLock, RunLockedError, read_holder
from workbench.core.storage import (
    STORAGE_FAILURES,
    StorageError,
    as_storage_error,
    check_free_space,
    ensure_writable_dir,
)
from workbench.train import checkpoint
from workbench.train.checkpoint import last_good_checkpoint, list_checkpoints, load_latest_checkpoint

# ---------------------------------------------------------------- naming storage failures


@pytest.mark.parametrize("code", sorted(STORAGE_FAILURES))
def test_every_storage_failure_names_path_failure_and_remedy(code, tmp_path):
    err = as_storage_error(OSError(code, os.strerror(code), str(tmp_path / "x")))
    assert isinstance(err, StorageError) and err.errno == code
    text = str(err)
    assert str(tmp_path / "x") in text and STORAGE_FAILURES[code][0] in text
    assert "Remedy: " in text and "output.root" in text


def test_other_errors_are_left_alone(tmp_path):
    assert as_storage_error(FileNotFoundError(errno.ENOENT, "missing", "x")) is None
    assert as_storage_error(ValueError("no")) is None
    assert as_storage_error(OSError(errno.ENOSPC, "full"), tmp_path).path == tmp_path  # path given separately


def test_full_disk_message_says_how_much_is_free(tmp_path):
    err = as_storage_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f")))
    assert "free there now" in str(err)
    noted = err.with_note("The last good checkpoint is step 4.")
    assert str(noted).endswith("The last good checkpoint is step 4.") and noted.errno == errno.ENOSPC


def test_ensure_writable_dir_creates_and_probes(tmp_path):
    target = tmp_path / "a" / "b"
    assert ensure_writable_dir(target) == target and target.is_dir()
    assert list(target.iterdir()) == []  # the probe file is gone


def test_a_file_in_the_way_is_named(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    for target in (blocker, blocker / "exp"):
        with pytest.raises(StorageError, match=r"results: it is a file, not a directory") as info:
            ensure_writable_dir(target)
        assert info.value.path == blocker and info.value.errno == errno.ENOTDIR


@pytest.mark.parametrize(("code", "words"), [(errno.EROFS, "read-only"), (errno.EACCES, "permission denied")])
def test_read_only_and_permission_denied_are_named(tmp_path, monkeypatch, code, words):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "r"))

    monkeypatch.setattr(storage.tempfile, "mkstemp", refuse)  # root ignores chmod: fail the way a user sees
    with pytest.raises(StorageError, match=words) as info:
        ensure_writable_dir(tmp_path / "r")
    assert info.value.errno == code and "Remedy" in str(info.value)


def test_check_free_space(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    assert check_free_space(tmp_path, 1, "a byte") == usage.free
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: usage._replace(free=3 << 20))
    with pytest.raises(StorageError, match=r"only 3.0 MB free, but one checkpoint needs 19.0 MB"):
        check_free_space(tmp_path, 19 << 20, "one checkpoint")


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_write_failure_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "evals.csv"
    wio.atomic_write_text(path, "old")
    monkeypatch.setattr(wio.os, "fsync", _enospc)
    with pytest.raises(OSError, match="No space left") as info:
        wio.atomic_write_text(path, "new")
    assert info.value.filename == str(path) and info.value.errno == errno.ENOSPC
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["evals.csv"]


def test_append_failure_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    wio.append_jsonl(path, {"step": 0})
    monkeypatch.setattr(wio.os, "fsync", _enospc)
    with pytest.raises(OSError) as info:
        wio.append_jsonl(path, {"step": 1})
    assert info.value.filename == str(path) and as_storage_error(info.value) is not None


def _torch_like_full_disk(obj, f):
    """What torch.save does on a full disk: part of the file, then a RuntimeError hiding the OSError."""
    f.write(b"PK" * 100)
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None


def test_checkpoint_on_a_full_disk_names_it_and_keeps_the_last_good_one(tmp_path, monkeypatch):
    state = {"model": {"w": torch.arange(10.0)}, "step": 1}
    checkpoint.save_checkpoint(tmp_path, 1, state)
    monkeypatch.setattr(checkpoint.torch, "save", _torch_like_full_disk)
    with pytest.raises(OSError) as info:
        checkpoint.save_checkpoint(tmp_path, 2, {**state, "step": 2})
    err = as_storage_error(info.value)
    assert err is not None and err.path == tmp_path / "checkpoints" / "step_000002"
    assert "no space left" in str(err)
    monkeypatch.undo()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    step, loaded = load_latest_checkpoint(tmp_path)
    assert step == 1 and torch.equal(loaded["model"]["w"], torch.arange(10.0))
    assert last_good_checkpoint(tmp_path) == (1, tmp_path / "checkpoints" / "step_000001")


def test_ctrl_c_inside_torch_save_stays_a_keyboard_interrupt(tmp_path, monkeypatch):
    """torch turns a KeyboardInterrupt raised in its write callback into RuntimeError("unexpected pos")."""

    class Interrupting:
        written = 0

        def write(self, data):
            self.written += 1
            if self.written == 3:  # inside torch's C++ writer (the first writes are plain Python)
                raise KeyboardInterrupt
            return len(data)

    real_save = checkpoint.torch.save
    with pytest.raises(RuntimeError, match="unexpected pos"):  # what torch does (measured: torch 2.13)
        real_save(torch.zeros(1000), Interrupting())
    monkeypatch.setattr(checkpoint.torch, "save", lambda obj, f: real_save(obj, Interrupting()))
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, 0, {"x": torch.zeros(1000)})
    assert list_checkpoints(tmp_path) == [] and list((tmp_path / "checkpoints").iterdir()) == []


def test_other_runtime_errors_of_torch_save_pass_through(tmp_path, monkeypatch):
    def broken(obj, f):
        raise RuntimeError("cannot pickle this")

    monkeypatch.setattr(checkpoint.torch, "save", broken)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        checkpoint.save_checkpoint(tmp_path, 0, {"x": 1})


def test_tensor_bytes_counts_nested_tensors():
    state = {"a": torch.zeros(10), "b": [torch.zeros(2, dtype=torch.float16), {"c": torch.zeros(3)}], "d": 7}
    assert checkpoint.tensor_bytes(state) == 40 + 4 + 12


# ---------------------------------------------------------------- one writer per directory


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
    first = DirectoryLock(tmp_path, ".run.lock", what="run directory", remedy="Start a separate run.")
    with first.acquire():
        holder = read_holder(first.path)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["started"]
        with pytest.raises(RunLockedError, match=r"run directory .* is locked by this process") as info:
            DirectoryLock(
                tmp_path, ".run.lock", what="run directory", remedy="Start a separate run."
            ).acquire()
        assert str(info.value).endswith("Start a separate run.") and info.value.holder == holder
    assert read_holder(first.path) is None  # a clean release leaves no record
    with DirectoryLock(tmp_path, ".run.lock") as again:
        assert again.held and again.previous is None


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from workbench.core.lock import DirectoryLock
    lock = DirectoryLock(sys.argv[1], ".run.lock").acquire()  # kept referenced: held until killed
    print("held", flush=True)
    time.sleep(120)
    """
)


def test_a_lock_held_by_a_process_that_was_killed_is_taken_over(tmp_path, caplog):
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"locked by pid {proc.pid} on host {socket.gethostname()}"):
            DirectoryLock(tmp_path, ".run.lock").acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert read_holder(tmp_path / ".run.lock")["pid"] == proc.pid  # the killed holder's record stays
    with caplog.at_level(logging.WARNING, logger="workbench.core.lock"):
        lock = DirectoryLock(tmp_path, ".run.lock", what="run directory").acquire()
    assert lock.previous["pid"] == proc.pid
    assert (
        f"taking over the stale lock of run directory {tmp_path}: its holder, pid {proc.pid}" in caplog.text
    )
    assert "(killed?)" in caplog.text
    assert read_holder(lock.path)["pid"] == os.getpid()
    lock.release()


_DEAD_RECORD = textwrap.dedent(
    """
    import json, os, sys, time, filelock
    def record(fd):
        record = {"pid": int(sys.argv[2]), "host": sys.argv[3], "started": "then"}
        os.pwrite(fd, json.dumps(record).encode(), 0)
    lock = filelock.FileLock(sys.argv[1], on_acquired=record)
    lock.acquire()
    print("held", flush=True)
    time.sleep(120)
    """
)


def test_a_lock_still_held_after_its_recorded_holder_died_says_who_to_look_for(tmp_path):
    """E.g. a child that inherited the lock's descriptor outlived the run that took it: never broken."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    lock_path = tmp_path / ".run.lock"
    args = [str(lock_path), str(dead_pid), socket.gethostname()]
    proc = subprocess.Popen([sys.executable, "-c", _DEAD_RECORD, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"pid {dead_pid} .* no longer running.*fuser {lock_path}"):
            DirectoryLock(tmp_path, ".run.lock").acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_an_unreadable_record_still_refuses(tmp_path, monkeypatch):
    with DirectoryLock(tmp_path, ".run.lock"):
        (tmp_path / ".run.lock").write_text("{garbled")
        with pytest.raises(RunLockedError, match=r"another process .* empty or unreadable"):
            DirectoryLock(tmp_path, ".run.lock").acquire()


def test_a_lock_in_a_read_only_directory_is_a_storage_error(tmp_path, monkeypatch):
    import filelock

    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".run.lock"))

    monkeypatch.setattr(filelock.FileLock, "acquire", refuse)
    with pytest.raises(StorageError, match="read-only"):
        DirectoryLock(tmp_path, ".run.lock").acquire()


def test_a_filesystem_without_flock_is_a_storage_error(tmp_path, monkeypatch):
    import filelock

    def no_flock(self, *args, **kwargs):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(filelock.FileLock, "acquire", no_flock)
    with pytest.raises(StorageError, match=r"offers no file locks.*Remedy: put the results root") as info:
        DirectoryLock(tmp_path, ".run.lock").acquire()
    assert info.value.errno == errno.ENOLCK and info.value.path == tmp_path / ".run.lock"


def test_holder_record_is_json(tmp_path):
    with DirectoryLock(tmp_path, "x.lock") as lock:
        record = json.loads(Path(lock.path).read_text())
    assert set(record) == {"pid", "host", "started", "command"}
