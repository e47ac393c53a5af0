"""Checkpoint save / verify / load and RNG states (workbench.train.checkpoint)."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.train.checkpoint import (
    capture_rng_state,
    list_checkpoints,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
    verify_checkpoint,
)

LOGGER = "workbench.train.checkpoint"


def _state(step: int) -> dict[str, object]:
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "tracker": {"window": [0.5, 0.25 * step], "step": step},
        "rng": capture_rng_state(),
        "marker": torch.full((16,), float(step)),
    }


def _steps(run_dir: Path) -> list[int]:
    return [s for s, _ in list_checkpoints(run_dir)]


def test_round_trip(tmp_path):
    state = _state(7)
    path = save_checkpoint(tmp_path, 7, state)
    assert path == tmp_path / "checkpoints" / "step_000007"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000007"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7 and set(manifest["files"]) == set(state)
    step, loaded = load_latest_checkpoint(tmp_path)
    assert step == 7 and set(loaded) == set(state)
    for key, value in state["model"].items():
        assert torch.equal(loaded["model"][key], value)
    assert loaded["tracker"] == state["tracker"]
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(loaded["model"])  # loads into a fresh module
    assert not [p for p in tmp_path.joinpath("checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_no_checkpoint_gives_none(tmp_path):
    assert load_latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    assert load_latest_checkpoint(tmp_path) is None


def _truncate(path: Path) -> None:
    f = path / "marker.pt"
    f.write_bytes(f.read_bytes()[:-10])


def _flip_byte(path: Path) -> None:
    f = path / "marker.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def _garbage_with_matching_manifest(path: Path) -> None:
    """Bytes that pass size and sha256 checks but are not a torch file: must still be skipped."""
    f = path / "marker.pt"
    f.write_bytes(b"not a torch file")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["marker"].update(bytes=16, sha256=hashlib.sha256(b"not a torch file").hexdigest())
    (path / "manifest.json").write_text(json.dumps(manifest))


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "bytes, manifest says"),
    "flipped_byte": (_flip_byte, "sha256"),
    "missing_manifest": (lambda p: (p / "manifest.json").unlink(), "manifest.json is missing"),
    "missing_file": (lambda p: (p / "tracker.pt").unlink(), "tracker.pt (state key 'tracker') is missing"),
    "bad_manifest": (lambda p: (p / "manifest.json").write_text('{"step": 2'), "unreadable"),
    "malformed_manifest": (
        lambda p: (p / "manifest.json").write_text('{"format_version": 1, "step": 2, "files": [1]}'),
        "malformed",
    ),
    "unloadable": (_garbage_with_matching_manifest, "failed to load"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_is_skipped_for_the_older_one(tmp_path, caplog, kind):
    damage, message = CORRUPTIONS[kind]
    save_checkpoint(tmp_path, 1, _state(1))
    newest = save_checkpoint(tmp_path, 2, _state(2))
    damage(newest)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = load_latest_checkpoint(tmp_path)
    assert step == 1 and torch.equal(state["marker"], torch.full((16,), 1.0))
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "step_000002" in warning[0] and message in warning[0]
    assert verify_checkpoint(newest) is not None or kind == "unloadable"


def test_every_checkpoint_corrupt_gives_none(tmp_path, caplog):
    for step in (1, 2):
        _flip_byte(save_checkpoint(tmp_path, step, _state(step)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_latest_checkpoint(tmp_path) is None
    assert caplog.text.count("skipping checkpoint") == 2


def test_leftover_temp_dir_is_ignored_and_removed(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, _state(1))
    stale = tmp_path / "checkpoints" / ".tmp-step_000002-abc123"
    stale.mkdir()
    torch.save(torch.zeros(3), stale / "marker.pt")  # a save killed before its manifest
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, _ = load_latest_checkpoint(tmp_path)
    assert step == 1 and not stale.exists()
    assert ".tmp-step_000002-abc123" in caplog.text


def test_latest_pointer_is_not_trusted(tmp_path):
    save_checkpoint(tmp_path, 1, _state(1))
    save_checkpoint(tmp_path, 2, _state(2))
    (tmp_path / "checkpoints" / "latest").write_text("step_000001\n")  # lagging pointer
    assert load_latest_checkpoint(tmp_path)[0] == 2
    (tmp_path / "checkpoints" / "latest").write_text("step_000099\n")  # dangling pointer
    assert load_latest_checkpoint(tmp_path)[0] == 2


def test_keep_last_pruning(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, {"x": torch.tensor(step)}, keep_last=2)
    assert _steps(tmp_path) == [4, 5]
    save_checkpoint(tmp_path, 6, {"x": torch.tensor(6)}, keep_last=1)
    assert _steps(tmp_path) == [6]
    save_checkpoint(tmp_path, 10, {"x": torch.tensor(10)}, keep_last=3)
    # resumed from 6 after 10 went bad: saving 8 keeps the later (abandoned) 10, never deletes the new one
    save_checkpoint(tmp_path, 8, {"x": torch.tensor(8)}, keep_last=1)
    assert _steps(tmp_path) == [8, 10]


def test_resaving_a_step_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 3, {"x": torch.tensor(1)})
    save_checkpoint(tmp_path, 3, {"x": torch.tensor(2), "y": 5})
    step, state = load_latest_checkpoint(tmp_path)
    assert step == 3 and state == {"x": torch.tensor(2), "y": 5}
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000003"]


@pytest.mark.parametrize(
    ("step", "state", "keep_last", "match"),
    [
        (-1, {"x": 1}, 2, "step must be"),
        (1, {}, 2, "non-empty"),
        (1, {"../x": 1}, 2, r"'\.\./x'"),
        (1, {"manifest": 1}, 2, "'manifest'"),
        (1, {"x": 1}, 0, "keep_last"),
    ],
)
def test_save_rejects_bad_arguments(tmp_path, step, state, keep_last, match):
    with pytest.raises(ValueError, match=match):
        save_checkpoint(tmp_path, step, state, keep_last=keep_last)


def _draws() -> tuple[list[float], np.ndarray, torch.Tensor]:
    return [random.random() for _ in range(3)], np.random.rand(3), torch.rand(3)


def test_rng_capture_restore_reproduces_draws(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()
    state = capture_rng_state()
    first = _draws()
    _draws()  # move every generator on
    save_checkpoint(tmp_path, 1, {"rng": state})
    restore_rng_state(load_latest_checkpoint(tmp_path)[1]["rng"])
    again = _draws()
    assert first[0] == again[0]
    np.testing.assert_array_equal(first[1], again[1])
    assert torch.equal(first[2], again[2])


def test_restoring_cuda_state_without_cuda_warns(caplog):
    state = capture_rng_state()
    state["cuda"] = [torch.zeros(8, dtype=torch.uint8)] * 3
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        restore_rng_state(state)
    if not torch.cuda.is_available() or torch.cuda.device_count() != 3:
        assert "CUDA RNG state for 3 device(s)" in caplog.text


_SAVER = textwrap.dedent(
    """
    import sys, torch
    from workbench.train.checkpoint import save_checkpoint
    step = 0
    while True:
        step += 1
        value = float(step)
        state = {"a": torch.full((20_000,), value), "b": {"step": step}, "c": torch.full((5,), value)}
        save_checkpoint(sys.argv[1], step, state, keep_last=2)
    """
)


def test_kill_minus_9_mid_save_leaves_a_loadable_checkpoint(tmp_path, caplog):
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(_steps(tmp_path)) < 2:
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.2))  # kill at an arbitrary point of a later save
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _steps(tmp_path), "the saver subprocess never finished a checkpoint"
    step, state = load_latest_checkpoint(tmp_path)
    assert step >= 1 and state["b"] == {"step": step}
    assert torch.equal(state["a"], torch.full((20_000,), float(step)))
    assert torch.equal(state["c"], torch.full((5,), float(step)))
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]


class _Payload:
    """Pickles as a call to ``Path.touch``: what a crafted checkpoint would run on an unsafe load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_checkpoint_carrying_a_callable_is_refused_without_running_it(tmp_path):
    """The manifest vouches for bytes, not for their author: a checkpoint whose file pickles a call (with a
    manifest that matches it) is refused by name, and the call never runs."""
    from workbench.train.checkpoint import UnsafeCheckpointError

    save_checkpoint(
        tmp_path, 3, _state(3)
    )  # an honest, older checkpoint: not used in the crafted one's place
    marker = tmp_path / "pwned"
    crafted = save_checkpoint(tmp_path, 5, {"trainer": {"step": 5, "payload": _Payload(marker)}})
    assert verify_checkpoint(crafted) is None  # its bytes match its manifest
    with pytest.raises(UnsafeCheckpointError, match=r"trainer\.pt was refused: it asks to call or build"):
        load_latest_checkpoint(tmp_path)
    assert not marker.exists()


def test_a_checkpoint_holding_numpy_rng_state_as_an_array_still_resumes(tmp_path):
    """Checkpoints written before the numpy state was saved as plain values hold numpy's own array: the safe
    loader accepts exactly that, and the draws after a restore are the same."""
    np.random.seed(5)
    old = {"python": random.getstate(), "torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    expected = np.random.rand(3)
    save_checkpoint(tmp_path, 1, {"rng": old, "optimizer": _state(1)["optimizer"]})
    _, loaded = load_latest_checkpoint(tmp_path)
    assert isinstance(loaded["rng"]["numpy"][1], np.ndarray)
    np.random.seed(6)
    restore_rng_state(loaded["rng"])
    np.testing.assert_array_equal(np.random.rand(3), expected)
    new = capture_rng_state()["numpy"]
    assert isinstance(new[1], list) and all(isinstance(k, int) for k in new[1])  # plain values now
