"""`Trainer.train_step` without models: scripted workers answer, the step's numbers are checked by hand.

`ScriptedWorkers` implements the `Executor` protocol with no model: each agent's answers (right or wrong) and
old log-likelihoods are scripted, and every learner's update request is recorded. The step's grading,
capability, ω, advantages and per-learner batches are then compared with values worked out below.

The script (P = 2 prompts, G = 2 answers per agent; 1 = right):

| prompt | agent 0 | agent 1 |
|---|---|---|
| 0 | 1 0 | 0 0 |
| 1 | 1 1 | 1 0 |

Accuracies 3/4 and 1/4, so after one step P̂ = (0.75, 0.25) and ω[k, j] = P̂_k / P̂_j: ω[0, 1] = 3,
ω[1, 0] = 1/3 (Eqs. 8-9). The joint std of both prompts' four rewards is 0.5. Learner 0's baseline (Eq. 7)
is (1 + 0 + 3·0 + 3·0)/4 = 1/4 on prompt 0, and (1 + 1 + 3·1 + 3·0)/4 = 5/4 on prompt 1: above the maximum
reward, so the guard takes its own mean, 1. Learner 1's: (1/3 + 0 + 0 + 0)/4 = 1/12 and
(2/3 + 1 + 0)/4 = 5/12.
"""

from __future__ import annotations

import json

import pytest
import torch

from workbench.agents.models.shipped import ZOO_ROOT
from workbench.config.experiment import from_dict
from workbench.core.losses import stepwise_lower_bound
from workbench.train.batches import plan_micro_batches
from workbench.train.data import TaskData
from workbench.train.exchange import (
    EvalReport,
    EvalRequest,
    RolloutReport,
    RolloutRequest,
    SharedRollout,
    UpdateReport,
    UpdateRequest,
    WorkerState,
)
from workbench.train.executors import Executor
from workbench.train.plan import AgentFacts
from workbench.train.rundir import RunWriter, create_run_dir
from workbench.train.trainer import Trainer

RIGHT_A_P_G = [[[1, 0], [1, 1]], [[0, 0], [1, 0]]]
"""Which answers are right: ``RIGHT_A_P_G[a][p][g]``."""


class ScriptedWorkers(Executor):
    """Workers without models: scripted answers and old log-probs out, update requests recorded."""

    def __init__(self, right_A_P_G: list[list[list[int]]], names: list[str]) -> None:
        self.right_A_P_G, self.names = right_A_P_G, names
        self.answers: list[str] = []  # the gold answers of the step's prompts, set by the test
        self.requests: list[UpdateRequest] = []

    def rollout(self, requests: list[RolloutRequest]) -> list[RolloutReport]:
        reports = []
        for a, request in enumerate(requests):
            rollouts = [
                SharedRollout(
                    prompt_index=p,
                    author=a,
                    index=g,
                    prompt=prompt,
                    text=f"\\boxed{{{self.answers[p] if self.right_A_P_G[a][p][g] else 'wrong'}}}",
                    finish_reason="eos",
                    length=3,
                    old_logp_sum=-(1.0 + a + p / 10 + g / 100),  # a scripted value that names the rollout
                    old_logp_count=3,
                )
                for p, prompt in enumerate(request.prompts)
                for g in range(request.n)
            ]
            reports.append(RolloutReport(rollouts, generate_s=0.0, score_s=0.0))
        return reports

    def update(self, requests: list[UpdateRequest]) -> list[UpdateReport]:
        self.requests = requests
        return [UpdateReport({f"loss/{name}": 0.0}) for name in self.names]

    def evaluate(self, request: EvalRequest) -> list[EvalReport]:
        raise AssertionError("no held-out set in this test")

    def state_dicts(self) -> list[WorkerState]:
        return [WorkerState({}, {}) for _ in self.names]

    def load_state_dicts(self, states: list[WorkerState]) -> None:
        raise AssertionError("no resume in this test")

    def start_weights(self) -> list[str]:
        return ["scripted"] * len(self.names)

    def memory_facts(self, prompts: list[str]) -> list[AgentFacts]:
        config = json.loads((ZOO_ROOT / "tiny" / "gpt2-char" / "config.json").read_text())
        return [AgentFacts(config, "cpu", 1 << 34, prompt_tokens=16) for _ in self.names]

    def use_memory_budgets(self, budgets: list[int]) -> None:
        assert len(budgets) == len(self.names) and min(budgets) > 0

    def close(self) -> None:
        pass


AGENTS = [{"model": "tiny:gpt2-char", "name": "a0"}, {"model": "tiny:llama-bpe", "name": "a1"}]


def _step(
    tmp_path, algorithm: str, right_A_P_G: list[list[list[int]]] = RIGHT_A_P_G, agents=AGENTS, **hacpo
) -> tuple[dict[str, float], list[UpdateRequest]]:
    cfg = from_dict(
        {
            "experiment": "step",
            "algorithm": algorithm,
            "agents": agents,
            "task": {"train_size": 8, "eval_size": 0, "reward": "numeric"},
            "train": {"prompts_per_step": 2, "group_size": 2, "minibatch_prompts": 1},
            "hacpo": hacpo,
            "output": {"root": str(tmp_path)},
        }
    )
    run_dir = create_run_dir(tmp_path, "step")
    RunWriter(run_dir).write_config(cfg.to_dict())
    workers = ScriptedWorkers(right_A_P_G, [a["name"] for a in agents])
    trainer = Trainer(cfg, run_dir, workers, TaskData.load(cfg))
    workers.answers = [item.answer for item in trainer.data.prompt_batch(1)]
    metrics = trainer.train_step()
    assert (run_dir / "samples" / "step_000001.jsonl").is_file()
    return metrics, workers.requests


def _rows(request: UpdateRequest, learner: int) -> list[tuple[int, int, int]]:
    """The learner's batch rows as (author, prompt, index): own rollouts first, then each source's."""
    own = [(learner, p, g) for p in range(2) for g in range(2)]
    return own + [(r.author, r.prompt_index, r.index) for r in request.cross]


def test_a_hacpo_step_gives_the_hand_computed_capability_omega_advantages_and_batches(tmp_path):
    metrics, (learner0, learner1) = _step(tmp_path, "hacpo")
    assert (metrics["train/acc/a0"], metrics["train/acc/a1"]) == (0.75, 0.25)
    assert metrics["capability/a0"] == pytest.approx(0.75) and metrics["capability/a1"] == pytest.approx(0.25)
    assert metrics["omega/a0/a1"] == pytest.approx(3.0) and metrics["omega/a1/a0"] == pytest.approx(1 / 3)
    assert metrics["adv/a0/baseline_fallback_frac"] == 0.5 and metrics["adv/a1/baseline_fallback_frac"] == 0
    # No prompt's four rewards are all equal: no uniform joint group for either learner.
    assert [metrics[f"adv/{k}uniform_group_frac"] for k in ("a0/", "a1/", "")] == [0.0, 0.0, 0.0]
    # Each learner trains on the other's four rollouts, as text with the source's own old log-likelihood.
    assert _rows(learner0, 0)[4:] == [(1, p, g) for p in range(2) for g in range(2)]
    assert [r.old_logp_sum for r in learner0.cross] == pytest.approx([-2.0, -2.01, -2.1, -2.11])
    assert [r.reward for r in learner1.cross] == [1.0, 0.0, 1.0, 1.0]
    # Eq. 10: a cross sample's loss coefficient is ω^(source, learner).
    assert learner0.coef_A[1].item() == pytest.approx(1 / 3) and learner1.coef_A[0].item() == pytest.approx(
        3.0
    )
    # Eqs. 6-7 with the guard: (R − μ̂) / σ with σ = 0.5 on both prompts; expected_L_P_A_G[k, p, a, g].
    expected_L_P_A_G = torch.tensor(
        [
            [[[1.5, -0.5], [-0.5, -0.5]], [[0.0, 0.0], [0.0, -2.0]]],
            [[[11 / 6, -1 / 6], [-1 / 6, -1 / 6]], [[7 / 6, 7 / 6], [7 / 6, -5 / 6]]],
        ]
    )
    for k, request in enumerate((learner0, learner1)):
        torch.testing.assert_close(request.advantages_P_A_G, expected_L_P_A_G[k], rtol=1e-5, atol=1e-5)
        # the learner's batch: its own four rows, then the other's, each with its advantage
        rows = _rows(request, k)
        assert [a for a, _, _ in rows] == [k] * 4 + [1 - k] * 4
        assert [request.advantages_P_A_G[p, a, g].item() for a, p, g in rows] == pytest.approx(
            [expected_L_P_A_G[k, p, a, g].item() for a, p, g in rows], rel=1e-5
        )


def test_a_gspo_step_keeps_each_learner_on_its_own_group(tmp_path):
    metrics, requests = _step(tmp_path, "gspo")
    # Uniform groups per agent: a0's prompt 1 (1 1), a1's prompt 0 (0 0); the step logs each and their mean.
    assert [metrics[f"adv/{k}uniform_group_frac"] for k in ("a0/", "a1/", "")] == [0.5, 0.5, 0.5]
    assert all(r.cross == [] and r.coef_A.tolist() == [1.0, 1.0] for r in requests)
    # Eq. 5 per agent: agent 0's prompt 0 is (1, 0) → ±1/(std + eps); its prompt 1 is uniform → 0.
    a0 = requests[0].advantages_P_A_G
    assert a0[0, 0].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert a0[1, 0].tolist() == [0.0, 0.0] and a0[:, 1].abs().sum() == 0  # never trains on agent 1's
    a1 = requests[1].advantages_P_A_G
    assert a1[0, 1].tolist() == [0.0, 0.0] and a1[1, 1].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert metrics["omega/a0/a1"] == pytest.approx(3.0)  # logged, but it changes nothing in GSPO
    all_wrong, _ = _step(tmp_path / "all-wrong", "gspo", [RIGHT_A_P_G[0], [[0, 0], [0, 0]]])
    assert [all_wrong[f"adv/{k}uniform_group_frac"] for k in ("a0/", "a1/", "")] == [0.5, 1.0, 0.75]


def test_the_step_logs_the_omega_each_learner_used_in_its_baseline_and_its_loss(tmp_path):
    metrics, _ = _step(tmp_path, "hacpo")
    assert metrics["omega_baseline/a0/a1"] == pytest.approx(3.0) and metrics[
        "omega_loss/a0/a1"
    ] == pytest.approx(1 / 3)
    assert metrics["omega_baseline/a0/a0"] == 1.0 and metrics["omega_loss/a1/a1"] == 1.0
    ablated, _ = _step(tmp_path / "no-adv-no-omega", "hacpo", capability_baseline=False, omega_in_loss=False)
    assert ablated["omega_baseline/a0/a1"] == 1.0 and ablated["omega_loss/a0/a1"] == 1.0
    assert ablated["omega/a0/a1"] == pytest.approx(3.0)  # the capability ratio itself is still logged


def test_own_group_advantage_gives_own_rows_eq5_and_keeps_the_shared_rows_capability_aware(tmp_path):
    """``hacpo.own_advantage: group``: a learner's own rows get Eq. 5 over its own G answers (summing to 0 per
    prompt), while the other agent's rows keep the learner's capability-aware advantage (Eqs. 6-7)."""
    _, joint = _step(tmp_path, "hacpo")
    _, group = _step(tmp_path / "group", "hacpo", own_advantage="group")
    for k, (a, b) in enumerate(zip(joint, group)):
        torch.testing.assert_close(b.advantages_P_A_G[:, 1 - k], a.advantages_P_A_G[:, 1 - k])
        own_P_G = b.advantages_P_A_G[:, k]
        assert own_P_G.sum(dim=-1).abs().max() < 1e-5
    # agent 0: prompt 0 answered (1, 0) → ±1/(std + eps); prompt 1 (1, 1) is uniform → 0
    assert group[0].advantages_P_A_G[0, 0].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert group[0].advantages_P_A_G[1, 0].tolist() == [0.0, 0.0]


THREE_RIGHT_A_P_G = [[[1, 0], [1, 1]], [[0, 0], [1, 0]], [[1, 0], [1, 1]]]
"""Three agents (P = 2, G = 2): agent 2 answers like agent 0."""
THREE = [*AGENTS, {"model": "tiny:llama-bpe-large", "name": "a2"}]


def test_a_three_agent_hacpo_step_by_hand(tmp_path):
    """HACRL for n = 3 (the paper runs n = 2): every quantity of one step worked out by hand.

    Accuracies 3/4, 1/4, 3/4, so P̂ = (0.75, 0.25, 0.75) and ω[k, j] = P̂_k / P̂_j (Eqs. 8-9): rows
    (1, 3, 1), (1/3, 1, 1/3), (1, 3, 1). Prompt 0's six rewards are 1 0 | 0 0 | 1 0 (Bessel std √(4/15)),
    prompt 1's 1 1 | 1 0 | 1 1 (std √(1/6)). Baselines (Eq. 7, the mean of ω-weighted rewards over all six):
    learner 0 on prompt 0 (1 + 0 + 1)/6 = 1/3, on prompt 1 (2 + 3 + 2)/6 = 7/6 > 1, so the guard takes its own
    mean 1; learner 1: (1/3 + 1/3)/6 = 1/9 and (2/3 + 1 + 2/3)/6 = 7/18; learner 2 as learner 0 (its own mean
    on prompt 1 is 1 too). Each learner trains on its own four rows, then the others' in agent order, with the
    loss coefficient ω^(source, learner) = ω[source, learner] (Eq. 10)."""
    metrics, requests = _step(tmp_path, "hacpo", THREE_RIGHT_A_P_G, agents=THREE)
    assert [metrics[f"train/acc/a{a}"] for a in range(3)] == [0.75, 0.25, 0.75]
    assert [metrics[f"capability/a{a}"] for a in range(3)] == pytest.approx([0.75, 0.25, 0.75])
    omega = [[1, 3, 1], [1 / 3, 1, 1 / 3], [1, 3, 1]]
    for k in range(3):
        for j in range(3):
            assert metrics[f"omega/a{k}/a{j}"] == pytest.approx(omega[k][j])
            assert metrics[f"omega_baseline/a{k}/a{j}"] == pytest.approx(omega[k][j])
            assert metrics[f"omega_loss/a{k}/a{j}"] == pytest.approx(omega[j][k] if j != k else 1.0)
    assert [metrics[f"adv/a{k}/baseline_fallback_frac"] for k in range(3)] == [0.5, 0.0, 0.5]
    baseline_L_P = torch.tensor([[1 / 3, 1.0], [1 / 9, 7 / 18], [1 / 3, 1.0]])
    sigma_P = torch.tensor([(4 / 15) ** 0.5, (1 / 6) ** 0.5])
    rewards_P_A_G = torch.tensor(THREE_RIGHT_A_P_G, dtype=torch.float32).permute(1, 0, 2)
    for k, request in enumerate(requests):
        expected_P_A_G = (rewards_P_A_G - baseline_L_P[k][:, None, None]) / (sigma_P[:, None, None] + 1e-6)
        torch.testing.assert_close(request.advantages_P_A_G, expected_P_A_G, rtol=1e-5, atol=1e-5)
        # its batch: own rows first, then each other agent's, in agent order
        sources = [a for a in range(3) if a != k]
        assert [(r.author, r.prompt_index, r.index) for r in request.cross] == [
            (a, p, g) for a in sources for p in range(2) for g in range(2)
        ]
        assert request.coef_A.tolist() == pytest.approx([omega[a][k] for a in range(3)])
        # mini-batches of one prompt's G rows (minibatch_prompts 1): own rows in m = 0, 1; the two sources'
        # in m = 2..5, each meeting the stepwise bound 1 − δ + m·δ_step (Eq. 14)
        plan = plan_micro_batches(range(12), 6, 2)
        m_B = [m for m, mb in enumerate(plan) for micro in mb.micro_batches for _ in micro]
        assert m_B == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
        bounds = [stepwise_lower_bound(m) for m in m_B[4:]]
        assert bounds == pytest.approx([0.85, 0.85, 0.875, 0.875, 0.9, 0.9, 0.925, 0.925])
