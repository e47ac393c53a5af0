"""The trainer end to end on tiny agents: reductions, resume after a kill, bad input, non-finite loss."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from workbench.agents.models.loading import load_agent
from workbench.config.experiment import ConfigError, from_dict
from workbench.config.loading import load_experiment
from workbench.core import losses
from workbench.lab.frames import load_runs, melt_metric
from workbench.train.checkpoint import list_checkpoints, load_latest_checkpoint
from workbench.train.run import fit, train
from workbench.train.trainer import TrainingError, start_trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "train": {
        "steps": 3,
        "prompts_per_step": 4,
        "group_size": 2,
        "minibatch_prompts": 2,
        "micro_batch_size": 3,  # odd on purpose: micro-batches of unequal sizes within a mini-batch
        "max_new_tokens": 12,
        "eval_every": 2,
        "save_every": 2,
        "lr": 1e-3,
    },
    "task": {"train_size": 40, "eval_size": 6},
}


def _config(tmp_path, agents=("tiny:gpt2-char", "tiny:llama-bpe"), **top):
    data = {"experiment": "t", "agents": list(agents), "output": {"root": str(tmp_path)}, **TINY} | top
    return from_dict(data)


@pytest.fixture
def mixed_rewards(monkeypatch):
    """The briefly warm-started tiny agents answer nothing right, so every advantage would be 0 and no sample
    forwarded (it adds nothing to the loss): grade by the parity of a response's length instead, which varies
    within a group, so that the update trains on own and shared samples."""
    from workbench.tasks.rewards import CORRECT, WRONG

    def by_parity(completions, answers, method="math_verify"):
        return [CORRECT if len(text) % 2 else WRONG for text in completions]

    monkeypatch.setattr("workbench.train.rewarding.grade_batch", by_parity)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    _, state = load_latest_checkpoint(run_dir)
    return {f"{k}/{n}": t for k, sd in state.items() if k.startswith("agent_") for n, t in sd.items()}


def test_hacpo_run_writes_a_complete_run_directory(tmp_path, mixed_rewards):
    run_dir = train(_config(tmp_path))
    names = sorted(p.name for p in run_dir.iterdir())
    assert {
        "config.yaml",
        "environment.json",
        "metrics.jsonl",
        "evals.csv",
        "samples",
        "checkpoints",
        "DONE",
    } <= set(names)
    df = load_runs([run_dir])
    assert list(df["step"]) == [0, 1, 2, 3]
    last = df.iloc[-1]
    # Self samples are on-policy in the first mini-batch; cross ratios exist for both directions.
    for learner, source in (("gpt2-char", "llama-bpe"), ("llama-bpe", "gpt2-char")):
        assert 0.0 <= last[f"is/{learner}/{source}/in_range_frac"] <= 1.0
        assert last[f"is/{learner}/{source}/ratio_mean"] > 0
    # Cost accounting: each agent generates P·G per step and trains on both agents' rollouts (A·P·G).
    assert last["cost/gpt2-char/generated_responses"] == 3 * 4 * 2
    assert last["cost/gpt2-char/trained_responses"] == 3 * 2 * 4 * 2
    assert last["cost/gpt2-char/updates"] == 3 * (2 * 4 // 2)
    assert not df["eval/acc/gpt2-char"].dropna().empty
    assert (run_dir / "samples" / "step_000003.jsonl").is_file()
    # Per-item results of every evaluation (steps 0, 2 and 3; 6 items per agent) agree with evals.csv.
    items = pd.read_csv(run_dir / "eval_items.csv")
    assert items.groupby(["step", "agent"]).size().to_dict() == {
        (s, a): 6 for s in (0, 2, 3) for a in ("gpt2-char", "llama-bpe")
    }
    greedy = pd.read_csv(run_dir / "evals.csv").query("metric == 'greedy_acc'")
    means = items.groupby(["step", "agent"])["greedy"].mean()
    assert all(means[(r.step, r.agent)] == pytest.approx(r.value) for r in greedy.itertuples())
    # Each agent's starting weights: the digest of the weights as loaded, not as trained.
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["start_weights"] == {
        a: load_agent(f"tiny:{a}").weights_digest() for a in ("gpt2-char", "llama-bpe")
    }
    # Rerunning the same config finds the finished run and does nothing.
    assert train(_config(tmp_path)) == run_dir


def test_one_agent_hacpo_reproduces_gspo_exactly(tmp_path):
    gspo = _config(tmp_path / "g", agents=["tiny:gpt2-char"], algorithm="gspo")
    # A single-agent HACPO config is not a valid user config (nothing to share) and validation rejects it,
    # so set the field behind validation's back: the reduction is a property of the code path.
    hacpo = dataclasses.replace(gspo, output=dataclasses.replace(gspo.output, root=str(tmp_path / "h")))
    object.__setattr__(hacpo, "algorithm", "hacpo")
    runs = []
    for cfg in (gspo, hacpo):
        run_dir = Path(cfg.output.root) / "run"
        run_dir.mkdir(parents=True)
        from workbench.train.rundir import RunWriter

        RunWriter(run_dir).write_config(cfg.to_dict())
        runs.append(fit(start_trainer(cfg, run_dir)))
    w_gspo, w_hacpo = (_final_weights(r) for r in runs)
    assert w_gspo.keys() == w_hacpo.keys()
    assert all(torch.equal(w_gspo[k], w_hacpo[k]) for k in w_gspo)
    m_gspo, m_hacpo = (load_runs([r]) for r in runs)
    assert m_gspo["loss/gpt2-char"].tolist()[1:] == m_hacpo["loss/gpt2-char"].tolist()[1:]


def test_kill_and_resume_reaches_the_same_final_state(tmp_path):
    cfg_data = {
        "experiment": "resume",
        "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
        **TINY,
        "train": {**TINY["train"], "steps": 4, "save_every": 1},
    }
    straight = train(from_dict({**cfg_data, "output": {"root": str(tmp_path / "a")}}))

    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump({**cfg_data, "output": {"root": str(tmp_path / "b")}}))
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
        found = list((tmp_path / "b").glob("resume/*/metrics.jsonl"))
        if found and sum(1 for _ in found[0].open()) >= 3:  # step 0, 1, 2 logged: kill during step 3
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
    w_straight, w_resumed = _final_weights(straight), _final_weights(resumed)
    assert all(torch.equal(w_straight[k], w_resumed[k]) for k in w_straight)
    a, b = load_runs([straight]), load_runs([resumed])
    assert list(b["step"]) == [0, 1, 2, 3, 4]  # every step logged exactly once
    for key in ("train/acc/gpt2-char", "loss/llama-bpe", "capability/llama-bpe", "eval/acc/gpt2-char"):
        assert a[key].tolist() == pytest.approx(b[key].tolist(), nan_ok=True), key


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    cfg = _config(tmp_path)

    def nan_loss(*args, **kwargs):
        loss, metrics = losses.hacpo_policy_loss(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setitem(losses.POLICY_LOSSES, "hacpo", nan_loss)
    with pytest.raises(
        TrainingError, match=r"non-finite loss nan at step 1, learner 'gpt2-char'.*last good checkpoint"
    ):
        train(cfg)
    (run_dir,) = list((tmp_path / "t").iterdir())
    assert [step for step, _ in list_checkpoints(run_dir)] == [0]
    assert load_latest_checkpoint(run_dir)[0] == 0


def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch):
    import workbench.train.worker as worker_module

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded for an invalid config")

    monkeypatch.setattr(worker_module, "load_agent", no_loading)
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump({"agents": ["tiny:gpt2-char", "tiny:llama-bpe"], "output": {"root": str(tmp_path)}})
    )
    for override, match in (
        (["hacpo.delta=1.5"], r"hacpo.delta = 1.5 is not allowed"),
        (["train.minibatch_prompts=3"], r"must divide train.prompts_per_step"),
        (["hacpo.windw=3"], r"unknown key hacpo.windw"),
    ):
        with pytest.raises(ConfigError, match=match):
            train(path, overrides=override)
    assert not (tmp_path / "bad").exists()


def test_samples_record_rewards_advantages_and_ratios(tmp_path):
    run_dir = train(_config(tmp_path, train={**TINY["train"], "steps": 1}))
    rows = [json.loads(line) for line in (run_dir / "samples" / "step_000001.jsonl").open()]
    assert rows and {"prompt", "text", "author", "reward", "grade"} <= set(rows[0])
    learners = {k for row in rows for k in row if k.startswith("learner/")}
    assert learners == {"learner/gpt2-char", "learner/llama-bpe"}
    assert {"advantage", "ratio", "lower_bound"} <= set(rows[0]["learner/gpt2-char"])


def test_a_lora_hacpo_step_of_smollm2_trains_only_its_adapters(tmp_path, smollm2_dir):
    """The real-pair recipe's SmolLM2 (warm start + fresh LoRA) in one HACPO step with a tiny BPE partner:
    only adapter weights change, and both directions of sharing log their cross ratios."""
    cfg = load_experiment(
        ROOT / "experiments" / "real_pair.yaml",
        {
            "agents.1": {"name": "llama-bpe", "model": "tiny:llama-bpe"},
            "seeds": None,
            "train.steps": 1,
            "train.prompts_per_step": 2,
            "train.group_size": 4,
            "train.minibatch_prompts": 1,
            "train.max_new_tokens": 20,  # one-operation problems: "73+87=160. \\boxed{160}" is 16 tokens
            "task.knobs.n_ops": [1, 1],  # the warm start solves about half: mixed rewards, so gradient
            "train.skip_uniform_groups": False,
            "task.eval_size": 2,
            "output.root": str(tmp_path),
        },
    )
    run_dir = train(cfg)
    df = load_runs([run_dir])
    assert list(df["step"]) == [0, 1]
    assert df["is/smollm2/smollm2/ratio_mean"].iloc[-1] == pytest.approx(1.0, abs=0.05)
    assert df["cost/smollm2/trained_responses"].iloc[-1] == 2 * 4 * 2
    for learner, source in (("smollm2", "llama-bpe"), ("llama-bpe", "smollm2")):
        assert pd.notna(df[f"is/{learner}/{source}/ratio_mean"].iloc[-1]), (learner, source)
    state = load_latest_checkpoint(run_dir)[1]["agent_0"]
    assert state and all("lora" in key for key in state)  # only the adapters are checkpointed
    assert any(v.abs().sum() > 0 for k, v in state.items() if "lora_B" in k)  # B starts at 0: it moved
    trained = load_agent(run_dir, agent="smollm2").model.get_base_model().state_dict()
    initial = load_agent(cfg.agents[0]).model.get_base_model().state_dict()
    base_keys = [k for k in initial if "lora_" not in k]
    assert base_keys and all(torch.equal(trained[k], initial[k]) for k in base_keys)


def test_recipe_switches_reach_the_step(tmp_path):
    """eval avg@k, Adam betas, skip_uniform_groups and bytes normalization, from the config to the metrics."""
    cfg = _config(
        tmp_path,
        train={
            **TINY["train"],
            "steps": 1,
            "eval_samples": 2,
            "adam_beta2": 0.99,
            "skip_uniform_groups": True,
        },
        hacpo={"ratio_normalization": "bytes"},
    )
    run_dir = train(cfg)
    df = load_runs([run_dir])
    last = df.iloc[-1]
    for name in ("gpt2-char", "llama-bpe"):
        assert 0.0 <= last[f"eval/avg@2/{name}"] <= 1.0 and 0.0 <= last[f"eval/acc/{name}"] <= 1.0
        assert 0.0 <= last[f"adv/{name}/kept_frac"] <= 1.0
        assert last[f"cost/{name}/trained_responses"] == round(last[f"adv/{name}/kept_frac"] * 2 * 4 * 2)
    _, state = load_latest_checkpoint(run_dir)
    assert state["optimizer_0"]["param_groups"][0]["betas"] == (0.9, 0.99)
    evals = (run_dir / "evals.csv").read_text()
    assert "avg@2" in evals and "greedy_acc" in evals


def test_a_finished_run_made_by_other_code_is_not_reused_silently(tmp_path, monkeypatch, caplog):
    import workbench.train.run as run_module

    cfg = _config(
        tmp_path, train={**TINY["train"], "steps": 1, "eval_every": 0}, task={**TINY["task"], "eval_size": 2}
    )
    first = train(cfg)
    assert train(cfg) == first  # same config, same code: reused
    monkeypatch.setattr(run_module, "code_version", lambda: "0123456789ab")  # as if the code had changed
    with caplog.at_level("INFO", logger="workbench.train.run"):
        second = train(cfg)
    assert second != first and (second / "DONE").exists()
    assert f"run {first} has this config but was made by other code" in caplog.text
    assert train(cfg, reuse_other_code=True) in (
        first,
        second,
    )  # explicitly allowed: a matching run is reused


def test_symmetric_naive_trains_shared_samples_against_the_learners_own_policy(tmp_path, mixed_rewards):
    """One step of Naive and of its symmetric variant from the same rollouts: only the shared samples' ratios
    differ (the variant's start from the learner's own policy, so they stay near 1)."""
    # A small learning rate: the learner stays near its start over the step's mini-batches.
    one_step = {"train": {**TINY["train"], "steps": 1, "lr": 1e-5}, "task": {**TINY["task"], "eval_size": 0}}
    runs = {}
    for label, switch in (("naive", False), ("naive-sym", True)):
        cfg = _config(
            tmp_path / label, algorithm="naive", label=label, hacpo={"naive_symmetric": switch}, **one_step
        )
        runs[label] = load_runs([train(cfg)]).iloc[-1]
    naive, sym = runs["naive"], runs["naive-sym"]
    assert naive["train/acc/gpt2-char"] == sym["train/acc/gpt2-char"]  # the same rollouts
    for learner, source in (("gpt2-char", "llama-bpe"), ("llama-bpe", "gpt2-char")):
        cross = f"is/{learner}/{source}/ratio_mean"
        assert abs(math.log(sym[cross])) < abs(math.log(naive[cross])), (sym[cross], naive[cross])


def test_ratio_statistics_per_minibatch_index(tmp_path, mixed_rewards):
    """Table 6 per mini-batch: every source's ratio mean and clip/in-range share under is_mb/<l>/<s>/<m>/, at
    indices of the step's updates; the is/ family keeps its (learner, source, stat) shape."""
    run_dir = train(_config(tmp_path, train={**TINY["train"], "steps": 1, "eval_every": 0}))
    row = load_runs([run_dir]).iloc[-1]
    updates = int(row["cost/gpt2-char/updates"])  # 2 agents x 4 prompts / 2 per mini-batch = 4
    assert updates == 4
    for learner, source in (("gpt2-char", "llama-bpe"), ("llama-bpe", "gpt2-char")):
        prefix = f"is_mb/{learner}/{source}"
        ms = sorted(
            {int(k.split("/")[3]) for k in row.index if k.startswith(f"{prefix}/") and pd.notna(row[k])}
        )
        assert ms and set(ms) <= set(range(updates))  # cross rows sit in the later mini-batches (self first)
        assert all(0.0 <= row[f"{prefix}/{m}/in_range_frac"] <= 1.0 for m in ms)
        assert all(pd.notna(row[f"{prefix}/{m}/ratio_mean"]) for m in ms)
        assert f"is_mb/{learner}/{learner}/0/clip_frac" in row.index
    df = load_runs([run_dir])
    assert set(melt_metric(df, "is").columns) >= {"learner", "source", "stat"}
    assert set(melt_metric(df, "is_mb").columns) >= {"learner", "source", "minibatch", "stat"}


def test_a_run_logs_what_the_diagnostics_view_reads(tmp_path, mixed_rewards):
    """Every learner × source signal, samples of every author, accuracy by difficulty: the run's own files
    give every panel of `workbench.lab.diagnostics`."""
    from workbench.lab import diagnostics, plots

    train_section = {**TINY["train"], "steps": 2, "eval_every": 2, "samples_per_step": 4}
    run_dir = train(_config(tmp_path, train=train_section))
    last = load_runs([run_dir]).iloc[-1]
    names = ("gpt2-char", "llama-bpe")
    for learner in names:
        total = sum(last[f"adv_src/{learner}/{s}/sum"] for s in names)
        assert total == pytest.approx(last[f"adv/{learner}/mean"] * 2 * 4 * 2, abs=1e-4)  # A·P·G rows
        for source in names:
            assert 0.0 <= last[f"grad_frac/{learner}/{source}"] <= 1.0
            assert last[f"length/{learner}/{source}"] > 0
            assert (
                last[f"omega_baseline/{learner}/{source}"] > 0 and last[f"omega_loss/{learner}/{source}"] > 0
            )
        assert math.isfinite(last[f"loss/{learner}"]) and math.isfinite(last[f"loss_clipped/{learner}"])
        assert last[f"train/length_chars/{learner}"] > 0
        evaluated = [last[f"eval_difficulty/{d}/items/{learner}"] for d in "123"]
        assert sum(x for x in evaluated if not math.isnan(x)) == 6  # every held-out item has its difficulty
    rows = [json.loads(line) for line in (run_dir / "samples" / "step_000002.jsonl").open()]
    assert [r["author"] for r in rows] == ["gpt2-char"] * 2 + ["llama-bpe"] * 2
    assert {r["prompt"] for r in rows[:2]} == {r["prompt"] for r in rows[2:]}
    frame = diagnostics.signals_frame([run_dir])
    assert set(frame["panel"]) == set(diagnostics.PANELS)
    by_difficulty = diagnostics.difficulty_frame([run_dir])
    logged = by_difficulty.query("step == 2")
    for row in logged.itertuples():
        assert row.greedy_acc == pytest.approx(last[f"eval_difficulty/{row.difficulty}/acc/{row.agent}"])
    plots.diagnostics_chart(frame).to_dict()
    samples = diagnostics.prompt_samples(run_dir, 2, 0)
    assert set(samples["author"]) == set(names) and "gpt2-char advantage" in samples.columns
    arms = diagnostics.arm_table([run_dir], "gpt2-char").iloc[0]
    assert arms["greedy"] == pytest.approx(last["eval/acc/gpt2-char"])
    assert arms["adv_sum llama-bpe"] == pytest.approx(
        load_runs([run_dir])["adv_src/gpt2-char/llama-bpe/sum"].mean()
    )
    assert {"greedy 1", "greedy 2", "greedy 3", "length_ratio", "grad_frac llama-bpe"} <= set(arms.index)
