"""The Ray executor against the in-process one: same metrics and weights, resume from a checkpoint, placement.

One local Ray session for the module (``num_cpus=2``, one CPU per agent). Each Ray actor runs torch with one
thread (its ``cpus_per_agent``), so the in-process reference runs with one thread too: with equal thread
settings the two executors do the same float operations in the same order, and the test asserts bit-identical
metrics and weights (tolerance 0).
"""

import dataclasses
import gc
import json
from pathlib import Path

import pytest
import torch

from workbench.config.experiment import from_dict
from workbench.train.checkpoint import load_latest_checkpoint
from workbench.train.executors import RayExecutor, RayOptions
from workbench.train.run import train

ray = pytest.importorskip("ray")

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


def test_ray_reproduces_the_in_process_run_bit_for_bit_and_resumes(tmp_path, ray_session):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each Ray actor runs with (cpus_per_agent = 1)
    try:
        local = train(_config(tmp_path / "local", "local"))
    finally:
        torch.set_num_threads(threads)

    def stop_after_step_2(metrics):
        if metrics["step"] == 2:  # logged and checkpointed
            raise _StopError

    ray_cfg = _config(tmp_path / "ray", "ray")
    with pytest.raises(_StopError):
        train(ray_cfg, on_step=stop_after_step_2)
    gc.collect()  # the interrupted trainer's actors end with their last handle
    (run_dir,) = (tmp_path / "ray" / "ex").iterdir()
    assert not (run_dir / "DONE").exists() and load_latest_checkpoint(run_dir)[0] == 2
    resumed = train(ray_cfg)  # new actors load the step-2 checkpoint and run step 3
    assert resumed == run_dir and (run_dir / "DONE").exists()

    assert _metrics(resumed) == _metrics(local)
    w_local, w_ray = _weights(local), _weights(resumed)
    assert w_local.keys() == w_ray.keys()
    assert all(torch.equal(w_local[k], w_ray[k]) for k in w_local)
    assert (local / "evals.csv").read_text() == (resumed / "evals.csv").read_text()


def test_a_cluster_too_small_for_the_agents_is_named_before_any_actor_starts(ray_session):
    spec = from_dict({"experiment": "ex", "output": {"root": "unused"}, **TINY}).agents[0]
    kwargs = [{"spec": spec, "index": a, "names": ["a", "b"], "settings": None} for a in range(2)]
    with pytest.raises(RuntimeError, match=r"need 8 CPU but 2 in the whole Ray cluster"):
        RayExecutor(kwargs, RayOptions(cpus_per_agent=4), seed=0)
    spec_gpu = dataclasses.replace(spec, device="cuda:1")
    with pytest.raises(RuntimeError, match=r"need 2 GPU but 0 in the whole Ray cluster"):
        RayExecutor([{**kw, "spec": spec_gpu} for kw in kwargs], RayOptions(), seed=0)
