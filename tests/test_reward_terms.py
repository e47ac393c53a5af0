"""Several reward functions with weights (``task.rewards``): what each is passed, the weighted sum the
advantages are of, accuracy kept apart for P̂, a bad function named with its item, a run that survives it."""

import json
import logging
import sys
import textwrap

import pytest
import torch

from workbench.config.experiment import from_dict
from workbench.core.types import TaskItem
from workbench.tasks import term_call, verifier
from workbench.tasks.reward_terms import (
    RewardFunctionError,
    columns,
    format_boxed,
    length_penalty,
    score_term,
    term_problem,
)
from workbench.train.checkpoint import list_checkpoints
from workbench.train.exchange import SharedRollout
from workbench.train.rewarding import grade_step
from workbench.train.run import train

ITEMS = [
    TaskItem(id="i0", question="1+1", answer="2", difficulty="1"),
    TaskItem(id="i1", question="2+5", answer="7", difficulty="2"),
]
MODULE = '''
import math, time

def likes_hard(completion, answer, difficulty, **kwargs):
    """Applies to difficulty 2 only; passes what it was given back through its value."""
    if difficulty != "2":
        return None
    return float(len(kwargs["prompt"]) + 10 * (answer == "7"))

def picky(completion, answer):
    return completion.endswith(answer)

def raises(completion, **kwargs):
    if kwargs["id"] == "i1":
        raise KeyError("no such column")
    return 1.0

def nan(completion, **kwargs):
    return math.nan

def text(completion, **kwargs):
    return "good"

def slow(completion, **kwargs):
    time.sleep(30 if kwargs["id"] == "i1" else 0)
    return 1.0
'''


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    """A module of reward functions importable here and in the grading worker processes (fresh ones)."""
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    verifier.close()  # the next call starts workers that see PYTHONPATH
    yield tmp_path
    verifier.close()
    term_call.import_function.cache_clear()
    sys.modules.pop("user_rewards", None)


def _cols(completion_length=3):
    return [columns(item, item.question + " answer:", completion_length, "eos", 8) for item in ITEMS]


def test_the_shipped_functions():
    assert (
        format_boxed("so \\boxed{12}") == 1.0
        and format_boxed("12") == 0.0
        and format_boxed("\\boxed{ }") == 0.0
    )
    assert length_penalty("abc", completion_length=4, max_new_tokens=8) == -0.5
    values = score_term("length_penalty", "len", ["a", "b"], _cols(2), ["x", "y"])
    assert values == [-0.25, -0.25]
    assert score_term("numeric", "acc", ["\\boxed{2}", "\\boxed{8}"], _cols(), ["x", "y"]) == [1.0, 0.0]


def test_your_function_runs_in_the_worker_processes_with_the_items_columns(user_rewards):
    where = ["item 'i0'", "item 'i1'"]
    assert score_term("user_rewards:likes_hard", "hard", ["a", "b"], _cols(), where) == [
        None,
        10.0 + len("2+5 answer:"),
    ]
    # a function naming only some columns gets only those; a bool is a float
    assert score_term("user_rewards:picky", "picky", ["is 2", "is 8"], _cols(), where) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            "user_rewards:raises",
            r"'raises' \(user_rewards:raises\) failed on item 'i1': KeyError: 'no such column'",
        ),
        (
            "user_rewards:nan",
            r"'nan' \(user_rewards:nan\) failed on item 'i0': returned nan: rewards must be finite",
        ),
        ("user_rewards:text", r"failed on item 'i0': returned 'good' \(str\): a reward is a float"),
    ],
)
def test_a_bad_function_is_named_with_the_item(user_rewards, fn, message):
    with pytest.raises(RewardFunctionError, match=message + r".*resumes from its last checkpoint"):
        score_term(fn, fn.split(":")[1], ["a", "b"], _cols(), ["item 'i0'", "item 'i1'"])


def test_a_function_past_the_deadline_counts_as_not_applicable(user_rewards, caplog):
    with caplog.at_level(logging.WARNING):
        values = score_term("user_rewards:slow", "slow", ["a", "b"], _cols(), ["item 'i0'", "item 'i1'"])
    assert values == [1.0, None]
    assert "overran its deadline on 1 of 2 responses (first: item 'i1')" in caplog.text


def test_a_function_is_tried_when_the_config_loads(user_rewards):
    assert term_problem("user_rewards:likes_hard", "task.rewards[i].fn") is None
    assert "has no function 'nope'" in term_problem("user_rewards:nope", "task.rewards[i].fn")
    assert "calling it on (completion=" in term_problem("user_rewards:text", "task.rewards[i].fn")
    assert "does not import" in term_problem("no_such_module:f", "task.rewards[i].fn")


def _rollouts(texts_A):
    return [
        [
            SharedRollout(p, a, g, ITEMS[p].question, text, "eos", 3, 0.0, 3)
            for p, texts in enumerate(texts_P)
            for g, text in enumerate(texts)
        ]
        for a, texts_P in enumerate(texts_A)
    ]


def test_the_advantages_are_of_the_weighted_sum_and_accuracy_stays_apart():
    task = from_dict(
        {
            "experiment": "x",
            "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
            "task": {
                "reward": "numeric",
                "rewards": [
                    {"fn": "numeric", "weight": 1.0},
                    {"fn": "format_boxed", "weight": 0.5, "name": "fmt"},
                ],
            },
        }
    ).task
    texts = [
        [["\\boxed{2}", "answer is 2"], ["\\boxed{1}", "7"]],
        [["\\boxed{3}", "2"], ["is 7", "\\boxed{7}"]],
    ]
    rollouts_A = _rollouts(texts)
    graded = grade_step(task, 8, ["a", "b"], rollouts_A, ITEMS, P=2, G=2)
    assert graded.accuracy_P_A_G.tolist() == [[[1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]]
    assert graded.rewards_P_A_G.tolist() == [[[1.5, 1.0], [0.5, 0.0]], [[0.5, 0.0], [0.0, 1.5]]]
    assert rollouts_A[0][0].reward == 1.5 and rollouts_A[0][0].reward_terms == {"numeric": 1.0, "fmt": 1.0}
    assert graded.metrics["reward/a/fmt/mean"] == 0.5 and graded.metrics["reward/b/numeric/mean"] == 0.25
    assert graded.metrics["reward/a/total/mean"] == pytest.approx(3.0 / 4)
    assert graded.metrics["reward/b/total/std"] == pytest.approx(
        torch.tensor([0.5, 0.0, 0.0, 1.5]).std().item()
    )
    # without task.rewards the run trains on the accuracy, as the paper
    plain = grade_step(
        from_dict({"experiment": "x", "agents": ["a", "b"]}).task,
        8,
        ["a", "b"],
        _rollouts(texts),
        ITEMS,
        2,
        2,
    )
    assert torch.equal(plain.rewards_P_A_G, plain.accuracy_P_A_G) and plain.metrics == {}


TINY = {
    "experiment": "rw",
    "agents": ["tiny:gpt2-char", "tiny:llama-bpe"],
    "train": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "minibatch_prompts": 1, "max_new_tokens": 8,
              "eval_every": 0, "eval_samples": 0, "save_every": 1},
    "task": {"train_size": 8, "eval_size": 4},
}  # fmt: skip


def test_a_run_logs_each_function_and_survives_a_bad_one(user_rewards, tmp_path):
    module = user_rewards / "user_rewards.py"
    module.write_text(
        textwrap.dedent(MODULE)
        + "\ndef flaky(completion, id, **kw):\n    return 1.0 if id == 'example-0' else {}['bug']\n"
    )
    rewards = [{"fn": "math_verify"}, {"fn": "format_boxed", "weight": 0.2}, {"fn": "user_rewards:flaky"}]
    data = {**TINY, "task": {**TINY["task"], "rewards": rewards}, "output": {"root": str(tmp_path / "runs")}}
    with pytest.raises(
        RewardFunctionError, match=r"'flaky' \(user_rewards:flaky\) failed on item .* of agent"
    ):
        train(from_dict(data))
    (run_dir,) = (tmp_path / "runs" / "rw").iterdir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0]  # nothing of step 1 was written
    assert [step for step, _ in list_checkpoints(run_dir)] == [0]
    # fixed (same name, same config): the run resumes from its checkpoint and finishes
    module.write_text(textwrap.dedent(MODULE) + "\ndef flaky(completion, **kw):\n    return 0.5\n")
    verifier.close()
    assert train(from_dict(data)) == run_dir
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for name in ("math_verify", "format_boxed", "flaky", "total"):
        assert f"reward/gpt2-char/{name}/mean" in rows[-1] and f"reward/llama-bpe/{name}/std" in rows[-1]
    assert rows[-1]["reward/gpt2-char/flaky/mean"] == 0.5
    sample = json.loads((run_dir / "samples" / "step_000002.jsonl").read_text().splitlines()[0])
    assert set(sample["rewards"]) == {"math_verify", "format_boxed", "flaky"}
    assert sample["reward"] == pytest.approx(
        sample["rewards"]["math_verify"] + 0.2 * sample["rewards"]["format_boxed"] + 0.5
    )
