"""What a run survives (issue 14): one writer per run, storage failures named, every step logged exactly once
after any resume, and kills at any instant (SIGKILL, Ctrl-C) ending in the same weights and logs.

After every drill `_assert_logged_once` reads ``metrics.jsonl``, ``evals.csv`` and ``samples/``.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from workbench.__main__ import main
from workbench.config.experiment import from_dict
from workbench.core import storage
from workbench.core.io import read_jsonl
from workbench.core.lock import RunLockedError
from workbench.core.storage import StorageError
from workbench.train import checkpoint, run
from workbench.train.checkpoint import list_checkpoints, load_latest_checkpoint
from workbench.train.run import train

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "experiment": "rel",
    "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
    "task": {"train_size": 40, "eval_size": 6},
    "train": {
        "steps": 4,
        "prompts_per_step": 4,
        "group_size": 2,
        "minibatch_prompts": 2,
        "micro_batch_size": 4,
        "max_new_tokens": 12,
        "eval_every": 2,
        "save_every": 2,
        "lr": 1e-3,
    },
}


def _data(root: Path, **train: int) -> dict:
    return {**TINY, "output": {"root": str(root)}, "train": {**TINY["train"], **train}}


def _assert_logged_once(run_dir: Path, steps: int, eval_every: int) -> None:
    """Each step exactly once in metrics.jsonl, evals.csv (per agent/metric) and samples/, no litter."""
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(steps + 1))
    evals = pd.read_csv(run_dir / "evals.csv")
    assert (evals.groupby(["step", "agent", "benchmark", "metric"]).size() == 1).all(), evals
    expected = sorted({0, steps} | set(range(eval_every, steps + 1, eval_every)))
    assert sorted(evals["step"].unique()) == expected
    assert list(evals["step"]) == sorted(evals["step"])  # in step order, never interleaved
    samples = sorted(p.name for p in (run_dir / "samples").iterdir())
    assert samples == [f"step_{s:06d}.jsonl" for s in range(1, steps + 1)]
    litter = [p for d in (run_dir, run_dir / "samples", run_dir / "checkpoints") for p in d.glob(".*.tmp*")]
    assert litter == []
    assert (run_dir / "DONE").is_file()


def _only_run(exp_dir: Path) -> Path:
    (run_dir,) = [p for p in exp_dir.iterdir() if p.is_dir()]
    return run_dir


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    _, state = load_latest_checkpoint(run_dir)
    return {f"{k}/{n}": t for k, sd in state.items() if k.startswith("agent_") for n, t in sd.items()}


def _same_run(a: Path, b: Path) -> None:
    """Equal final weights, metrics (wall times aside), evals and samples."""
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ma, mb = (
        [
            {k: v for k, v in row.items() if not k.startswith("time/")}
            for row in read_jsonl(d / "metrics.jsonl")
        ]
        for d in (a, b)
    )
    assert pd.DataFrame(ma).equals(pd.DataFrame(mb))
    assert (a / "evals.csv").read_text() == (b / "evals.csv").read_text()
    for path in sorted((a / "samples").iterdir()):
        assert path.read_text() == (b / "samples" / path.name).read_text(), path.name


class _CrashError(Exception):
    """Stands for a kill at a chosen instant, in-process."""


def _crash_at(monkeypatch, step: int) -> None:
    """Make the trainer die inside step ``step`` (after generation and update, before its logs)."""
    original = run.Trainer.train_step

    def train_step(self):
        metrics = original(self)
        if self.step == step:
            raise _CrashError(f"killed inside step {step}")
        return metrics

    monkeypatch.setattr(run.Trainer, "train_step", train_step)


@pytest.mark.parametrize(
    ("crash_step", "resumes_from"),
    [(1, 0), (3, 2)],
    ids=["resume-from-step-0", "resume-from-an-eval-row"],
)
def test_every_step_logged_once_after_a_resume(tmp_path, monkeypatch, caplog, crash_step, resumes_from):
    cfg = from_dict(_data(tmp_path))
    _crash_at(monkeypatch, crash_step)
    with pytest.raises(_CrashError):
        train(cfg)
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="workbench.train.run"):
        run_dir = train(cfg)
    assert f"from step {resumes_from}" in caplog.text
    _assert_logged_once(run_dir, 4, 2)


def test_a_second_train_of_a_running_run_stops_at_once_and_fresh_runs_apart(tmp_path, monkeypatch):
    cfg = from_dict(_data(tmp_path, steps=2))
    inside, release = threading.Event(), threading.Event()
    results: dict[str, Path] = {}

    def hold(metrics):
        inside.set()
        release.wait(60)

    first = threading.Thread(target=lambda: results.update(first=train(cfg, on_step=hold)))
    first.start()
    try:
        assert inside.wait(120), "the first run never reached its first step"
        loaded = []
        monkeypatch.setattr(
            run, "Trainer", lambda *a, **k: loaded.append(1)
        )  # the refused call loads nothing
        start = time.perf_counter()
        with pytest.raises(RunLockedError, match=r"is locked by this process .* resume=False") as info:
            train(cfg)
        assert time.perf_counter() - start < 5 and loaded == []
        assert info.value.holder["pid"] == os.getpid()
        monkeypatch.undo()
        results["fresh"] = train(cfg, resume=False)  # asked for: a separate run, trained alongside
    finally:
        release.set()
        first.join(120)
    assert results["fresh"] != results["first"] and results["fresh"].parent == results["first"].parent
    for run_dir in results.values():
        _assert_logged_once(run_dir, 2, 2)


def test_a_full_disk_mid_run_is_named_and_the_last_good_checkpoint_kept(tmp_path, monkeypatch):
    cfg = from_dict(_data(tmp_path))
    original = checkpoint.torch.save

    def save(obj, f):
        if ".tmp-step_000004" in f.name:  # torch's way: part of a file, then an error hiding the OSError
            f.write(b"PK" * 100)
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from None
        original(obj, f)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(StorageError) as info:
        train(cfg)
    text = str(info.value)
    run_dir = _only_run(tmp_path / "rel")
    assert f"cannot write {run_dir / 'checkpoints' / 'step_000004'}: no space left on the device" in text
    assert "Remedy: free space" in text
    assert (
        f"The last good checkpoint, step 2 ({run_dir / 'checkpoints' / 'step_000002'}), is untouched" in text
    )
    assert [s for s, _ in list_checkpoints(run_dir)] == [0, 2]
    monkeypatch.undo()
    assert train(cfg) == run_dir
    _assert_logged_once(run_dir, 4, 2)


def test_preflight_refuses_a_disk_without_room_for_a_checkpoint(tmp_path, monkeypatch):
    usage = storage.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: usage._replace(free=3 << 20))
    with pytest.raises(
        StorageError, match=r"only 3.0 MB free, but one checkpoint of this run \(.* MB\) plus"
    ):
        train(from_dict(_data(tmp_path)))
    run_dir = _only_run(tmp_path / "rel")
    assert list_checkpoints(run_dir) == [] and not (run_dir / "metrics.jsonl").exists()


def test_cli_exits_2_with_one_line_for_storage_and_lock_errors(tmp_path, caplog, monkeypatch):
    blocker = tmp_path / "results"
    blocker.write_text("a file where the results root should be")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**_data(blocker)}))
    monkeypatch.setattr(run, "Trainer", lambda *a, **k: pytest.fail("a model was loaded"))
    with caplog.at_level(logging.ERROR, logger="workbench"):
        assert main(["run", str(path)]) == 2
    assert f"error: cannot write {blocker}: it is a file, not a directory" in caplog.text
    assert "Traceback" not in caplog.text


# ---------------------------------------------------------------- kills at any instant

_STANDBY = textwrap.dedent(
    """
    import sys
    # Pay every import before "go", so that the drill's time goes to training, not to starting Python.
    import transformers.models.gpt2.modeling_gpt2, transformers.models.llama.modeling_llama
    import workbench.__main__
    import workbench.train.run
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)
    sys.argv = [workbench.__main__.__file__, "run", sys.argv[1]]  # as `python -m workbench run` sets it
    sys.exit(workbench.__main__.cli())  # what `python -m workbench` runs
    """
)


class _Standby:
    """``python -m workbench run <yaml>`` (the CLI's `main`), started ahead and released with `go`."""

    def __init__(self, path: Path, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _STANDBY, str(path)],
            cwd=ROOT,
            env=os.environ | {"TQDM_DISABLE": "1"},
            stdin=subprocess.PIPE,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )

    def go(self) -> None:
        deadline = time.monotonic() + 120
        while "ready" not in self.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def output(self) -> str:
        return self.log.read_text()


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240, poll: float = 0.005) -> bool:
    """Poll until ``predicate()`` (True) or the process ended (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    raise AssertionError("timed out waiting for the training subprocess")


def _phase(run_dir: Path | None) -> str:
    """Where a kill landed, judged from what it left behind."""
    if run_dir is None or not (run_dir / "checkpoints").is_dir():
        return "start-up"
    if any(p.name.startswith(".tmp-") for p in (run_dir / "checkpoints").iterdir()):
        return "checkpoint write"
    logged = (
        [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
        if (run_dir / "metrics.jsonl").exists()
        else []
    )
    samples = sorted((run_dir / "samples").glob("step_*.jsonl")) if (run_dir / "samples").is_dir() else []
    last_sample = int(samples[-1].stem.split("_")[1]) if samples else 0
    if last_sample > (logged[-1] if logged else -1):
        return f"evaluation or logging of step {last_sample}" if last_sample % 2 == 0 else "logging"
    return f"generation/update of step {(logged[-1] if logged else -1) + 1}"


@pytest.mark.slow
def test_kills_at_random_instants_end_in_the_same_weights_and_logs(tmp_path):
    """SIGKILL inside a step, a checkpoint write and an evaluation, each at a random delay after its trigger,
    a Ctrl-C, and two writers racing for the last resume; then the run equals an uninterrupted one."""
    steps = 6
    path = tmp_path / "kill.yaml"
    path.write_text(yaml.safe_dump(_data(tmp_path / "killed", steps=steps)))
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    standby = _Standby(path, log_dir / "0.log")  # importing while the reference trains
    reference = train(from_dict(_data(tmp_path / "straight", steps=steps)))
    exp_dir = tmp_path / "killed" / "rel"

    def run_dir() -> Path | None:
        found = [p for p in exp_dir.iterdir() if p.is_dir()] if exp_dir.is_dir() else []
        return found[0] if found else None

    def ckpt_tmp() -> bool:
        d = run_dir()
        return (
            d is not None
            and (d / "checkpoints").is_dir()
            and any(p.name.startswith(".tmp-") for p in (d / "checkpoints").iterdir())
        )

    def new_sample(even: bool):
        d = run_dir()
        before = set((d / "samples").glob("*.jsonl")) if d is not None and (d / "samples").is_dir() else set()

        def appeared() -> bool:
            d = run_dir()
            now = (
                set((d / "samples").glob("*.jsonl")) if d is not None and (d / "samples").is_dir() else set()
            )
            return any(int(p.stem.split("_")[1]) % 2 == 0 or not even for p in now - before)

        return appeared

    def step0_saved() -> bool:
        d = run_dir()
        return d is not None and (d / "checkpoints" / "step_000000" / "manifest.json").exists()

    seed = int(os.environ.get("KILL_DRILL_SEED", time.time_ns() % 1_000_000))  # set it to replay a failure
    rng = random.Random(seed)
    plan = [  # (what to wait for: a predicate's factory, random extra delay range in seconds, signal)
        ("inside step 1 (resume from step 0)", lambda: step0_saved, (0.0, 1.0), signal.SIGKILL),
        ("inside a checkpoint write", lambda: ckpt_tmp, (0.0, 0.0), signal.SIGKILL),
        ("inside an evaluation", lambda: new_sample(even=True), (0.0, 0.05), signal.SIGKILL),
        ("Ctrl-C", lambda: new_sample(even=False), (0.0, 1.0), signal.SIGINT),
    ]
    landed = [f"KILL_DRILL_SEED={seed}"]
    for i, (label, make_trigger, (lo, hi), sig) in enumerate(plan, start=1):
        proc = standby.proc
        trigger = make_trigger()
        standby.go()
        nxt = _Standby(path, log_dir / f"{i}.log")  # the next resume imports while this one trains
        if not _wait_for(trigger, proc):
            landed.append(f"{label}: finished first")
            standby = nxt
            break
        time.sleep(rng.uniform(lo, hi))
        proc.send_signal(sig)
        rc = proc.wait(60)
        landed.append(f"{label}: {_phase(run_dir())}")
        if sig == signal.SIGINT:
            out = standby.output()
            assert rc in (130, 0), out  # 0: the interrupt came after the run finished
            if rc == 130:
                assert "is resumable" in out and f"python -m workbench run {path}" in out, out
                assert "Traceback" not in out, out
        standby = nxt
    # The last resume: two writers started together; one trains, the other stops at once with exit code 2.
    rival = _Standby(path, log_dir / "rival.log")
    standby.go()
    rival.go()
    codes = sorted([standby.proc.wait(240), rival.proc.wait(240)])
    outputs = standby.output() + rival.output()
    print("kills landed:", *landed, sep="\n  ")
    assert codes in ([0, 2], [0, 0]), outputs  # [0, 0]: the first finished before the second looked
    if codes == [0, 2]:
        assert "is locked by pid" in outputs and "error: run directory" in outputs
    final = run_dir()
    _assert_logged_once(final, steps, 2)
    _same_run(reference, final)
    assert list(exp_dir.iterdir()) == [final]  # one run directory: no resume started a run of its own
