"""Evaluation metrics against brute force and hand-worked examples; `evaluate` end to end with a fake
generator (the agents module's `generate` is replaced by a deterministic stand-in)."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.core.types import TaskItem
from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.metrics import accuracy_by_difficulty, avg_at_k, best_at_k, pass_at_k, pass_ks, summarize
from workbench.tasks.prompts import PAPER_INSTRUCTION
from workbench.train import evaluate as evaluate_module
from workbench.train.evaluate import SAMPLE_COLUMNS, difficulty_metrics, evaluate

# ---------------------------------------------------------------------------------------------- pure metrics


def _pass_brute(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_over_all_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_pass_brute(n, c, k), abs=1e-12), (n, c, k)


@given(st.integers(1, 200), st.data())
def test_pass_at_k_properties(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the plain success rate
    assert (value == 0.0) == (c == 0)
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match=r"0 <= c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match=r"1 <= k <= n"):
        pass_at_k(4, 2, 5)


def test_avg_and_best_at_k_hand_worked():
    rewards_I_K = np.array([[0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    assert avg_at_k(rewards_I_K) == pytest.approx(5 / 12)
    assert best_at_k(rewards_I_K) == pytest.approx(3 / 4)
    assert pass_ks(1) == [1] and pass_ks(8) == [1, 2, 4, 8] and pass_ks(30) == [1, 2, 4, 8, 16, 30]


def test_summarize_hand_worked_frame():
    rows = []
    for item, (greedy, sampled) in enumerate([(1, [1, 0, 0, 1]), (0, [0, 0, 0, 0]), (1, [1, 1, 1, 0])]):
        rows.append(("a", "b", f"q{item}", 0, True, float(greedy)))
        rows += [("a", "b", f"q{item}", s, False, float(r)) for s, r in enumerate(sampled)]
    samples = pd.DataFrame(rows, columns=["agent", "benchmark", "item", "sample", "greedy", "reward"])
    summary = summarize(samples).set_index("metric")["value"]
    assert list(summary.index) == ["greedy_acc", "avg@4", "pass@1", "pass@2", "pass@4", "best@4"]
    assert summary["greedy_acc"] == pytest.approx(2 / 3)
    assert summary["avg@4"] == summary["pass@1"] == pytest.approx(5 / 12)
    assert summary["pass@2"] == pytest.approx((1 - 1 / 6 + 0 + 1) / 3)  # C(2,2)/C(4,2) = 1/6 for item 0
    assert summary["pass@4"] == summary["best@4"] == pytest.approx(2 / 3)


def test_summarize_names_missing_columns():
    with pytest.raises(ValueError, match=r"lack columns \['greedy'"):
        summarize(pd.DataFrame({"agent": [], "benchmark": [], "item": [], "reward": []}))


# ---------------------------------------------------------------------------------------------- evaluate


@dataclass
class FakeRollout:
    text: str
    length: int


class FakeAgent:
    name = "fake"


def _fake_generate(calls):
    """Greedy: right on even-numbered items. Sampled: item i's sample s is right when (i + s) % 3 == 0."""

    def generate(
        agent, prompts, n=1, *, temperature=None, max_new_tokens=None, seed=None, batch_size=None, **kw
    ):
        calls.append(
            {"n": n, "temperature": temperature, "max_new_tokens": max_new_tokens, "prompts": prompts}
        )
        out = []
        for prompt in prompts:  # prompt-major, as the real generate
            i = int(re.search(r"#(\d+)", prompt).group(1))
            answer = int(re.search(r"= (\d+)", prompt).group(1))
            for s in range(n):
                right = i % 2 == 0 if temperature == 0 else (i + s) % 3 == 0
                text = f"steps \\boxed{{{answer if right else answer + 1}}}"
                out.append(FakeRollout(text=text, length=len(text) + s))
        return out

    return generate


@pytest.fixture
def fake_agents(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(evaluate_module, "generate", _fake_generate(calls))
    return calls


ITEMS = [
    TaskItem(id=f"q{i}", question=f"#{i}: 2*{i} = {2 * i}?", answer=str(2 * i), source="toy")
    for i in range(6)
]


def test_evaluate_end_to_end_with_a_fake_generator(fake_agents):
    result = evaluate(FakeAgent(), ITEMS, k=3, temperature=0.7, max_new_tokens=16, method="numeric")
    samples = result.samples
    assert list(samples.columns) == list(SAMPLE_COLUMNS)
    assert len(samples) == 6 * (1 + 3)
    assert set(samples["agent"]) == {"fake"} and set(samples["benchmark"]) == {"toy"}
    greedy = samples[samples["greedy"]]
    assert list(greedy["reward"]) == [1.0, 0.0] * 3
    sampled = samples[~samples["greedy"]].set_index(["item", "sample"])["reward"]
    assert all(sampled[(f"q{i}", s)] == float((i + s) % 3 == 0) for i in range(6) for s in range(3))
    assert set(samples["reason"]) == {"correct", "wrong"}

    summary = result.summary.set_index("metric")["value"]
    assert summary["greedy_acc"] == pytest.approx(0.5)
    assert summary["avg@3"] == pytest.approx(1 / 3)  # exactly one right sample per item
    assert summary["pass@2"] == pytest.approx(pass_at_k(3, 1, 2))
    assert summary["best@3"] == summary["pass@3"] == 1.0

    greedy_call, sampled_call = fake_agents
    assert greedy_call["temperature"] == 0 and greedy_call["n"] == 1
    assert sampled_call["temperature"] == 0.7 and sampled_call["n"] == 3
    assert greedy_call["max_new_tokens"] == 16
    assert greedy_call["prompts"][0] == f"{ITEMS[0].question} {PAPER_INSTRUCTION}"


def test_evaluate_options(fake_agents):
    result = evaluate(FakeAgent(), ITEMS[:2], k=0, instruction=None, benchmark="bench", agent_name="me")
    assert len(fake_agents) == 1 and fake_agents[0]["prompts"] == [ITEMS[0].question, ITEMS[1].question]
    assert list(result.summary["metric"]) == ["greedy_acc"]
    assert set(result.samples["benchmark"]) == {"bench"} and set(result.samples["agent"]) == {"me"}
    with pytest.raises(ValueError, match="generates nothing"):
        evaluate(FakeAgent(), ITEMS, k=0, greedy=False)
    with pytest.raises(ValueError, match="temperature=0"):
        evaluate(FakeAgent(), ITEMS, k=2, temperature=0)
    with pytest.raises(ValueError, match="items is empty"):
        evaluate(FakeAgent(), [])


def test_item_rows_count_correct_responses_per_item(fake_agents):
    result = evaluate(FakeAgent(), ITEMS, k=3, temperature=0.7, method="numeric")
    rows = result.item_rows()
    # Greedy: right on even items; sampled: item i's sample s right when (i + s) % 3 == 0, once per item.
    assert rows == [
        {
            "agent": "fake",
            "benchmark": "toy",
            "item": f"q{i}",
            "greedy": int(i % 2 == 0),
            "sampled": 1,
            "k": 3,
        }
        for i in range(6)
    ]
    summary = result.summary.set_index("metric")["value"]
    assert np.mean([r["greedy"] for r in rows]) == summary["greedy_acc"]
    assert np.mean([r["sampled"] / r["k"] for r in rows]) == pytest.approx(summary["avg@3"])
    assert all(type(v) in (str, int) for r in rows for v in r.values())  # plain data: crosses processes
    greedy_only = evaluate(FakeAgent(), ITEMS[:2], k=0).item_rows()
    assert [(r["greedy"], r["sampled"], r["k"]) for r in greedy_only] == [(1, None, 0), (0, None, 0)]


def test_summary_rows_fit_the_results_log(fake_agents):
    from workbench.core.evalcsv import _EVAL_METRIC_RE, item_row

    items = embedded_task("test", 4)
    result = evaluate(
        FakeAgent(),
        [TaskItem(i.id, f"#{n}: {i.question} = 0", "0", source="embedded") for n, i in enumerate(items)],
        k=2,
    )
    rows = result.rows()
    assert rows and all(set(r) == {"agent", "benchmark", "metric", "value"} for r in rows)
    assert all(_EVAL_METRIC_RE.match(r["metric"]) for r in rows)
    assert all(
        item_row(0, i, row)[4:] == [row["greedy"], row["sampled"], 2]
        for i, row in enumerate(result.item_rows())
    )


# ---------------------------------------------------------------------------------------------- tiny agent


@pytest.fixture(scope="module")
def tiny_agent(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HACPO_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("HACPO_TINY_WARM_STEPS", "5")  # a barely trained build, in seconds
    from workbench.agents.models.loading import load_agent

    yield load_agent("tiny:gpt2-char")
    mp.undo()


def test_evaluate_a_tiny_agent(tiny_agent):
    items = embedded_task("test", 12)
    kwargs = {"k": 3, "instruction": None, "max_new_tokens": 12, "batch_size": 16, "seed": 5}
    first = evaluate(tiny_agent, items, **kwargs)
    again = evaluate(tiny_agent, items, **kwargs)
    samples = first.samples
    assert len(samples) == 12 * 4 and set(samples["agent"]) == {tiny_agent.name}
    assert set(samples["benchmark"]) == {"embedded"} and set(samples["reward"]) <= {0.0, 1.0}
    assert samples["length"].between(1, 12).all()
    pd.testing.assert_frame_equal(samples, again.samples)  # greedy, and seeded sampling, repeat exactly
    metrics = first.summary.set_index("metric")["value"]
    assert list(metrics.index) == ["greedy_acc", "avg@3", "pass@1", "pass@2", "pass@3", "best@3"]
    assert metrics.between(0, 1).all() and metrics["pass@3"] == metrics["best@3"] >= metrics["avg@3"]


def test_embedded_items_carry_their_number_of_operations_as_difficulty():
    items = embedded_task("test", 60, seed=0, regime="addsub")
    for item in items:
        assert item.difficulty == str(sum(item.question.count(op) for op in "+-"))
    assert {item.difficulty for item in items} == {"1", "2", "3"}


def test_accuracy_by_difficulty_from_item_rows():
    rows = [
        {"item": "a", "greedy": 1, "sampled": 2, "k": 2},
        {"item": "b", "greedy": 0, "sampled": 1, "k": 2},
        {"item": "c", "greedy": 1, "sampled": 0, "k": 2},
        {"item": "d", "greedy": 0, "sampled": None, "k": 0},  # no difficulty: left out
    ]
    by = accuracy_by_difficulty(rows, {"a": "10", "b": "2", "c": "2", "d": ""})
    assert list(by) == ["2", "10"]  # numeric order
    assert by["2"] == {"items": 2.0, "greedy_acc": 0.5, "avg@2": 0.25}
    assert by["10"] == {"items": 1.0, "greedy_acc": 1.0, "avg@2": 1.0}
    metrics = difficulty_metrics("x", rows, {"a": "1", "b": "1", "c": "3"})
    assert metrics == {
        "eval_difficulty/1/items/x": 2.0,
        "eval_difficulty/1/acc/x": 0.5,
        "eval_difficulty/1/avg@2/x": 0.75,
        "eval_difficulty/3/items/x": 1.0,
        "eval_difficulty/3/acc/x": 1.0,
        "eval_difficulty/3/avg@2/x": 0.0,
    }
