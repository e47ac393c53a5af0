"""Learning-rate schedules (``train.lr_schedule``, per agent): transformers' schedulers stepped once per
training step, the constant one giving exactly today's floats, the rate logged, a killed run resuming it."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from workbench.agents.models.schedules import lr_scheduler
from workbench.config.experiment import from_dict
from workbench.config.loading import load_experiment
from workbench.train.checkpoint import load_latest_checkpoint
from workbench.train.run import train

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "agents": ["tiny:gpt2-char", {"model": "tiny:llama-bpe", "lr": 2e-3, "lr_schedule": "linear"}],
    "train": {"steps": 4, "prompts_per_step": 4, "group_size": 2, "minibatch_prompts": 2,
              "max_new_tokens": 10, "eval_every": 0, "eval_samples": 0, "save_every": 1, "lr": 1e-3,
              "lr_schedule": "cosine", "warmup_steps": 1},
    "task": {"train_size": 16, "eval_size": 4},
}  # fmt: skip


def _steps(schedule: str, warmup: int, steps: int, lr: float = 1e-3) -> list[float]:
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([weight], lr=lr)
    scheduler = lr_scheduler(optimizer, schedule, warmup=warmup, steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    return rates


def test_the_constant_schedule_is_exactly_the_plain_optimizer():
    lr = 1e-4 / 3  # a float that any rescaling would change in its last bits
    rates = _steps("constant", 0, 5, lr)
    assert rates == [lr] * 5 and all(r.hex() == lr.hex() for r in rates)
    plain, scheduled = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    a, b = torch.optim.AdamW([plain], lr=lr), torch.optim.AdamW([scheduled], lr=lr)
    scheduler = lr_scheduler(b, "constant", warmup=0, steps=5)
    for step in range(5):
        for p, opt in ((plain, a), (scheduled, b)):
            p.grad = torch.full((3,), float(step + 1))
            opt.step()
        scheduler.step()
    assert torch.equal(plain, scheduled)


def test_warmup_then_linear_or_cosine_decay_by_hand():
    lr, steps, warmup = 1e-3, 5, 1
    assert _steps("linear", warmup, steps, lr) == pytest.approx([0.0, lr, lr * 3 / 4, lr / 2, lr / 4])
    cosine = [lr * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))) for s in range(1, steps)]
    assert _steps("cosine", warmup, steps, lr) == pytest.approx([0.0, *cosine])
    assert _steps("constant", 2, 4, lr) == pytest.approx([0.0, lr / 2, lr, lr])


def _lrs(run_dir: Path, agent: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[f"train/lr/{agent}"] for r in rows if r["step"] > 0]


def test_a_run_logs_each_agents_rate_and_a_killed_run_resumes_its_schedule(tmp_path):
    straight = train(from_dict({"experiment": "sched", **TINY, "output": {"root": str(tmp_path / "a")}}))
    lr = 1e-3
    assert _lrs(straight, "gpt2-char") == pytest.approx(
        [0.0, lr, lr * 0.5 * (1 + math.cos(math.pi / 3)), lr * 0.5 * (1 + math.cos(2 * math.pi / 3))]
    )
    assert _lrs(straight, "llama-bpe") == pytest.approx([0.0, 2e-3, 2e-3 * 2 / 3, 2e-3 / 3])
    _, state = load_latest_checkpoint(straight)
    assert state["scheduler_0"]["last_epoch"] == 4 and state["scheduler_1"]["base_lrs"] == [2e-3]

    path = tmp_path / "sched.yaml"
    path.write_text(yaml.safe_dump({"experiment": "sched", **TINY, "output": {"root": str(tmp_path / "b")}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", str(path)],
        cwd=ROOT,
        env=os.environ | {"OMP_WAIT_POLICY": "PASSIVE"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = None
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        found = list((tmp_path / "b").glob("sched/*/metrics.jsonl"))
        if found and sum(1 for _ in found[0].open()) >= 3:  # steps 0-2 logged: kill during step 3
            metrics = found[0]
            break
        time.sleep(0.05)
    assert metrics is not None, "the training subprocess never reached step 2"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_dir = metrics.parent
    assert not (run_dir / "DONE").exists()
    resumed = train(load_experiment(path))
    assert resumed == run_dir
    for agent in ("gpt2-char", "llama-bpe"):
        assert _lrs(resumed, agent) == _lrs(straight, agent)
    a, b = load_latest_checkpoint(straight)[1], load_latest_checkpoint(resumed)[1]
    for part in ("agent_0", "agent_1"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    assert a["scheduler_1"] == b["scheduler_1"]


def test_a_checkpoint_without_a_schedule_resumes_at_a_constant_rate(tmp_path):
    """Checkpoints written before schedules were saved: their runs had a constant rate, and resume with it."""
    cfg = from_dict({"experiment": "old", **TINY, "train": {**TINY["train"], "lr_schedule": "constant",
                     "warmup_steps": 0, "steps": 2}, "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
                     "output": {"root": str(tmp_path)}})  # fmt: skip
    run_dir = train(cfg)
    step_dir = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    for part in ("scheduler_0", "scheduler_1"):
        (step_dir / f"{part}.pt").unlink()
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith("scheduler_")}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    from workbench.train.trainer import start_trainer

    trainer = start_trainer(cfg, run_dir)
    try:
        _, state = load_latest_checkpoint(run_dir)
        assert "scheduler_0" not in state
        trainer.load_state_dict(state)
        assert trainer.step == 2
    finally:
        trainer.close()
