"""The threads and Ray executors against the in-process one: same metrics and weights, resume, placement.

The in-process reference (``local``) runs with one torch thread, as each agent does under ``threads`` (two
agents on this 2-core machine) and in each Ray actor (its ``cpus_per_agent`` = 1): with equal thread settings
the executors do the same float operations in the same order, and the tests assert bit-identical metrics and
weights (tolerance 0). The Ray tests share one local Ray session (``num_cpus=2``) and skip without Ray.
"""

import dataclasses
import gc
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from workbench.config.experiment import from_dict
from workbench.train import executors
from workbench.train.checkpoint import load_latest_checkpoint
from workbench.train.executors import InProcessExecutor, RayExecutor, RayOptions
from workbench.train.run import train
from workbench.train.settings import WorkerArgs

TINY = {
    "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
    "train": {
        "steps": 3,
        "prompts_per_step": 4,
        "group_size": 2,
        "minibatch_prompts": 2,
        "micro_batch_size": 3,
        "max_new_tokens": 10,
        "eval_every": 2,
        "save_every": 2,
        "lr": 1e-3,
    },
    "task": {"train_size": 40, "eval_size": 4},
}


@pytest.fixture(scope="module")
def ray_session(hacpo_cache):
    """A local Ray with 2 CPUs; actors inherit the session's cache and warm-step settings."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _config(root: Path, executor: str):
    return from_dict({"experiment": "ex", "executor": executor, "output": {"root": str(root)}, **TINY})


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    _, state = load_latest_checkpoint(run_dir)
    return {f"{k}/{n}": t for k, part in state.items() if k.startswith("agent_") for n, t in part.items()}


class _StopError(Exception):
    """Stands in for a kill after a checkpoint."""


@pytest.fixture(scope="module")
def local_one_thread(tmp_path_factory, hacpo_cache) -> Path:
    """The reference: the in-process run with one torch thread (what each agent gets under the others)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(_config(tmp_path_factory.mktemp("local"), "local"))
    finally:
        torch.set_num_threads(threads)


def _stop_after_step_2(metrics):
    if metrics["step"] == 2:  # logged and checkpointed
        raise _StopError


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    assert (run_dir / "DONE").exists()
    assert _metrics(run_dir) == _metrics(reference)
    w_run, w_ref = _weights(run_dir), _weights(reference)
    assert w_run.keys() == w_ref.keys()
    assert all(torch.equal(w_run[k], w_ref[k]) for k in w_ref)
    assert (run_dir / "evals.csv").read_text() == (reference / "evals.csv").read_text()


def test_ray_reproduces_the_in_process_run_bit_for_bit_and_resumes(tmp_path, ray_session, local_one_thread):
    ray_cfg = _config(tmp_path / "ray", "ray")
    with pytest.raises(_StopError):
        train(ray_cfg, on_step=_stop_after_step_2)
    gc.collect()  # the interrupted trainer's actors end with their last handle
    (run_dir,) = (tmp_path / "ray" / "ex").iterdir()
    assert not (run_dir / "DONE").exists() and load_latest_checkpoint(run_dir)[0] == 2
    resumed = train(ray_cfg)  # new actors load the step-2 checkpoint and run step 3
    assert resumed == run_dir
    _assert_same_run(resumed, local_one_thread)


def test_threads_reproduce_the_in_process_run_bit_for_bit_and_resume(tmp_path, local_one_thread, two_threads):
    cfg = _config(tmp_path / "threads", "threads")
    with pytest.raises(_StopError):
        train(cfg, on_step=_stop_after_step_2)
    assert torch.get_num_threads() == 2  # the driver's threads, after its agents' threads ran with one
    (run_dir,) = (tmp_path / "threads" / "ex").iterdir()
    assert not (run_dir / "DONE").exists() and load_latest_checkpoint(run_dir)[0] == 2
    resumed = train(cfg)
    assert resumed == run_dir
    _assert_same_run(resumed, local_one_thread)


class _FakeWorker:
    """Stands in for an `AgentWorker` (no model): records its thread and torch threads, meets the others."""

    meet: threading.Barrier

    def __init__(self, index: int, fail: bool = False) -> None:
        self.index, self.fail, self.seen, self.done = index, fail, {}, False

    @classmethod
    def build(cls, args: WorkerArgs) -> "_FakeWorker":
        return cls(args.index, fail=args.settings == "fail")

    def update(self, request):
        self.seen = {"thread": threading.get_ident(), "torch_threads": torch.get_num_threads()}
        self.meet.wait(timeout=10)  # both agents must be in here at once, else BrokenBarrierError
        if self.fail:
            raise ValueError(f"agent {self.index} failed")
        time.sleep(0.2 * (1 - self.index))  # agent 0 ends last
        self.done = True
        return f"report {self.index} of {request}"

    def close(self) -> None:
        self.closed = True


def _fake_executor(monkeypatch, fail: tuple[bool, bool] = (False, False)) -> InProcessExecutor:
    monkeypatch.setattr(executors, "AgentWorker", _FakeWorker)
    _FakeWorker.meet = threading.Barrier(2)
    workers = [WorkerArgs(None, k, ("a", "b"), "fail" if fail[k] else None) for k in range(2)]
    return InProcessExecutor(workers, parallel=True)


def test_threads_run_the_agents_at_once_with_a_share_of_the_torch_threads(monkeypatch, two_threads):
    executor = _fake_executor(monkeypatch)
    try:
        assert executor.update(["r0", "r1"]) == ["report 0 of r0", "report 1 of r1"]  # agent order
    finally:
        executor.close()
    first, second = (w.seen for w in executor.workers)
    assert first["thread"] != second["thread"] != threading.get_ident()
    assert first["torch_threads"] == second["torch_threads"] == 1
    assert torch.get_num_threads() == 2


def test_a_failing_agent_is_raised_after_the_other_has_ended(monkeypatch, two_threads):
    executor = _fake_executor(monkeypatch, fail=(False, True))
    with pytest.raises(ValueError, match="agent 1 failed"):
        executor.update(["r0", "r1"])
    assert executor.workers[0].done  # not still running when its caller handles agent 1's error
    assert torch.get_num_threads() == 2
    executor.close()


def test_a_cluster_too_small_for_the_agents_is_named_before_any_actor_starts(ray_session):
    spec = from_dict({"experiment": "ex", "output": {"root": "unused"}, **TINY}).agents[0]
    workers = [WorkerArgs(spec, a, ("a", "b"), None) for a in range(2)]
    with pytest.raises(RuntimeError, match=r"need 8 CPU but 2 in the whole Ray cluster"):
        RayExecutor(workers, RayOptions(cpus_per_agent=4), seed=0)
    spec_gpu = dataclasses.replace(spec, device="cuda:1")
    with pytest.raises(RuntimeError, match=r"need 2 GPU but 0 in the whole Ray cluster"):
        RayExecutor([dataclasses.replace(w, spec=spec_gpu) for w in workers], RayOptions(), seed=0)
