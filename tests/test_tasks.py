"""Task sources: the embedded generator checked against its own expressions, reasoning-gym, file loaders."""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

from workbench.tasks import loaders
from workbench.tasks.arithmetic import (
    DEFAULT_REGIME,
    REGIMES,
    embedded_solution,
    embedded_task,
    resolve_regime,
    solve_steps,
)
from workbench.tasks.prompts import PAPER_INSTRUCTION, build_prompt, split_of
from workbench.tasks.sources import load_tasks

DATA = Path(__file__).parent / "data"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval_arith(expression: str) -> int:
    """Independent reference: Python's own parser and precedence, restricted to + - * on integers."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"unexpected node in {expression!r}: {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body)


# ---------------------------------------------------------------------------------------------- embedded


@pytest.mark.parametrize(
    "knobs",
    [{}, {"regime": "mixed"}, {"n_ops": (3, 3)}, {"regime": "mixed", "n_ops": (1, 2), "max_operand": 99}],
)
def test_embedded_answers_match_their_expressions(knobs):
    items = embedded_task("train", 300, seed=3, **knobs) + embedded_task("test", 100, seed=3, **knobs)
    regime = resolve_regime(**knobs)
    lo, hi = regime.n_ops
    for item in items:
        assert re.fullmatch(r"\d+([-+*]\d+)*", item.question)
        assert set(re.findall(r"[-+*]", item.question)) <= set(regime.ops)
        assert lo <= len(re.findall(r"[-+*]", item.question)) <= hi
        assert int(item.answer) == _eval_arith(item.question)
        assert item.solution.endswith(f"\\boxed{{{item.answer}}}")
        for step in re.findall(r"(-?\d+)([-+*])(\d+)=(-?\d+)", item.solution):
            a, op, b, c = step
            assert _OPS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult}[op]](int(a), int(b)) == int(c)
            assert regime.allow_negative or int(c) >= 0


def test_regimes_keep_the_old_mixed_regime_by_name():
    assert DEFAULT_REGIME == "addsub" and set(REGIMES) >= {"addsub", "mixed"}
    mixed, custom = resolve_regime("mixed"), resolve_regime(ops="+-*", allow_negative=True)
    assert (mixed.ops, mixed.n_ops, mixed.max_operand, mixed.allow_negative) == (
        custom.ops, custom.n_ops, custom.max_operand, custom.allow_negative,
    )  # fmt: skip
    assert any("*" in i.question for i in embedded_task("train", 100, regime="mixed"))
    assert max(int(i.answer) for i in embedded_task("train", 2000)) <= 36
    with pytest.raises(
        ValueError, match=r"regime = 'nope' is not allowed: one of \['addsub', 'addsub2', 'mixed'\]"
    ):
        embedded_task("train", 1, regime="nope")
    with pytest.raises(ValueError, match=r"ops = '\+/' is not allowed"):
        embedded_task("train", 1, ops="+/")


def _chi2_p(counts_a: Counter, counts_b: Counter) -> float:
    """p-value of a 2 x k chi-square test of homogeneity (torch's regularized gamma, no scipy)."""
    keys = sorted(set(counts_a) | set(counts_b), key=str)
    table = [[counts_a[k] for k in keys], [counts_b[k] for k in keys]]
    rows, cols = [sum(r) for r in table], [sum(c) for c in zip(*table)]
    total = sum(rows)
    chi2 = sum(
        (table[i][j] - rows[i] * cols[j] / total) ** 2 / (rows[i] * cols[j] / total)
        for i in range(2)
        for j in range(len(keys))
    )
    dof = torch.tensor((len(keys) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(chi2 / 2, dtype=torch.float64)))


def _n_ops(item) -> int:
    return len(re.findall(r"[-+*]", item.question))


def _answer_size(item) -> str:
    return ("-" if item.answer.startswith("-") else "") + str(len(item.answer.lstrip("-")))


@pytest.mark.parametrize("regime", sorted(REGIMES))
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_train_and_test_come_from_the_same_distribution(regime, seed):
    """Operation-count and answer-size histograms of 4000 train vs 1000 held-out items agree (chi-square)."""
    train = embedded_task("train", 4000, seed=seed, regime=regime)
    test = embedded_task("test", 1000, seed=seed, regime=regime)
    for feature in (_n_ops, _answer_size):
        p = _chi2_p(Counter(map(feature, train)), Counter(map(feature, test)))
        assert p > 0.01, (feature.__name__, p)


def test_answers_are_drawn_from_the_population_not_the_partition():
    """Large draws: per operation count, each split's answer distribution matches the whole space's."""
    train, test = embedded_task("train", 30_000, seed=9), embedded_task("test", 30_000, seed=9)
    for k in (1, 2, 3):
        tr = [i for i in train if _n_ops(i) == k]
        te = [i for i in test if _n_ops(i) == k]
        two_digit_tr = sum(len(i.answer) == 2 for i in tr) / len(tr)
        two_digit_te = sum(len(i.answer) == 2 for i in te) / len(te)
        assert abs(two_digit_tr - two_digit_te) < 0.02, (k, two_digit_tr, two_digit_te)


def test_embedded_solution_is_short_and_stepwise():
    assert embedded_solution("3+4*2") == ("4*2=8, 3+8=11. \\boxed{11}", 11)
    assert solve_steps("8-2-3") == (["8-2=6", "6-3=3"], 3)  # left to right, not 8-(2-3)
    lengths = [len(i.solution) for i in embedded_task("train", 500)]
    assert max(lengths) <= 36 and sum(lengths) / len(lengths) < 34
    mixed = [len(i.solution) for i in embedded_task("train", 500, regime="mixed")]
    assert max(mixed) <= 45 and sum(mixed) / len(mixed) < 40


def test_embedded_is_deterministic_iid_and_prefix_stable():
    a = embedded_task("train", 200, seed=7)
    assert a == embedded_task("train", 200, seed=7)
    assert embedded_task("train", 50, seed=7) == a[:50]
    assert [i.id for i in a[:2]] == ["embedded-train-0", "embedded-train-1"]
    assert a != embedded_task("train", 200, seed=8)
    test = embedded_task("test", 1000)
    assert 400 < len({i.question for i in test}) < 1000  # i.i.d.: the small 1-operation stratum repeats
    big = embedded_task(
        "train", 300, max_operand=99, n_ops=(3, 3)
    )  # too large to enumerate: sampled directly
    assert len({i.question for i in big}) == 300


def test_embedded_train_and_test_never_share_an_item():
    train = {i.question for s in (0, 1) for i in embedded_task("train", 2000, seed=s)}
    test = {i.question for s in (0, 1) for i in embedded_task("test", 500, seed=s)}
    assert not train & test
    assert all(split_of(q) == "test" for q in test)


def test_embedded_bad_knobs_name_the_knob():
    with pytest.raises(ValueError, match="split='dev'"):
        embedded_task("dev", 5)
    with pytest.raises(ValueError, match="n_ops"):
        embedded_task("train", 5, n_ops=(3, 1))
    with pytest.raises(ValueError, match="max_operand"):
        embedded_task("train", 5, max_operand=0)
    with pytest.raises(ValueError, match="too few to give both splits"):
        embedded_task("test", 100, n_ops=(1, 1), max_operand=1, ops="+")  # "1+1" is the only expression


def test_build_prompt():
    assert build_prompt("3+4") == f"3+4 {PAPER_INSTRUCTION}"
    assert build_prompt("3+4", None) == build_prompt("3+4", "") == "3+4"
    assert PAPER_INSTRUCTION == "Let's think step by step and output the final answer within \\boxed{}."


# ---------------------------------------------------------------------------------------------- load_tasks


def test_load_tasks_dispatches_and_rejects_unknown_names():
    assert load_tasks("embedded", split="test", n=5, seed=1) == embedded_task("test", 5, seed=1)
    assert len(load_tasks("embedded", n=None)) == 1000
    with pytest.raises(ValueError, match=r"unknown task source 'gsm9k'.*embedded.*gsm8k"):
        load_tasks("gsm9k")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['colour'\]"):
        load_tasks("math500", colour="red")


@pytest.mark.parametrize("name", ["gsm_symbolic", "basic_arithmetic"])
def test_gym_generators_offline(name):
    train = load_tasks(f"gym:{name}", split="train", n=12, seed=0)
    test = load_tasks(f"gym:{name}", split="test", n=6, seed=0)
    assert len(train) == 12 and len(test) == 6
    assert not {i.question for i in train} & {i.question for i in test}
    for item in train:
        assert item.source == f"gym:{name}" and item.question and item.answer
        if name == "gsm_symbolic":
            assert item.solution.endswith(f"\\boxed{{{item.answer}}}") and "####" not in item.solution
    assert load_tasks(f"gym:{name}", n=12, seed=0) == train


def test_gym_unknown_generator_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym generator 'nope'.*gsm_symbolic"):
        load_tasks("gym:nope", n=3)


# ---------------------------------------------------------------------------------------------- file layouts

EXPECTED = {  # benchmark -> (number of items, answers, first question starts with)
    "gsm8k": (3, ["31", "5000", "5"], "Mia buys"),
    "math": (3, ["\\frac{5}{6}", "4", "\\{-3, 3\\}"], "What is"),
    "math500": (2, ["5\\sqrt{2}", "(-2,2)"], "Compute"),
    "aime2025": (2, ["807", "29"], "Find the remainder"),
    "amc23": (3, ["100", "52", "\\frac{15}{2}"], "What is the sum"),
    "minerva": (2, ["45", "500"], "A ball"),
    "olympiadbench": (2, ["2, 3", "6"], "Find all real"),
}
FILES = {"math": "math_train.jsonl", "amc23": "amc23.json", "olympiadbench": "olympiadbench.json"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_benchmark_loader_reads_its_fixture(name):
    path = DATA / FILES.get(name, f"{name}.jsonl")
    items = load_tasks(name, path=str(path))
    count, answers, start = EXPECTED[name]
    assert [i.answer for i in items] == answers and len(items) == count
    assert items[0].question.startswith(start)
    assert all(i.source == name for i in items)
    assert all(i.solution is None or "\\boxed{" in i.solution for i in items)
    assert len({i.id for i in items}) == count


def test_layout_details():
    gsm = loaders.read_items(DATA / "gsm8k.jsonl")
    assert gsm[0].solution.endswith("\\boxed{31}") and "####" not in gsm[0].solution
    assert loaders.read_items(DATA / "math500.jsonl")[0].id == "math500-test/prealgebra/17.json"
    assert loaders.read_items(DATA / "aime2025.jsonl", source="aime2025")[1].id == "aime2025-2025-I-2"
    assert loaders.read_items(DATA / "olympiadbench.json")[1].solution.endswith("\\boxed{6}")


def test_env_data_dir_and_split_file_names(tmp_path, monkeypatch):
    (tmp_path / "gsm8k_test.jsonl").write_text((DATA / "gsm8k.jsonl").read_text())
    (tmp_path / "math500.jsonl").write_text((DATA / "math500.jsonl").read_text())
    monkeypatch.setenv("HACPO_DATA_DIR", str(tmp_path))
    assert len(load_tasks("gsm8k", split="test")) == 3
    assert len(load_tasks("math500", split="train")) == 2  # evaluation-only: the split is ignored
    with pytest.raises(FileNotFoundError, match=r"gsm8k.*train.*path=.*HACPO_DATA_DIR"):
        load_tasks("gsm8k", split="train")


def test_missing_file_without_hub_names_the_alternative(monkeypatch):
    monkeypatch.delenv("HACPO_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"aime2025.*HF_HUB_OFFLINE.*path="):
        load_tasks("aime2025")


def test_verl_parquet_layout(tmp_path):
    records = [
        {
            "data_source": "DigitalLearningGmbH/MATH-lighteval",
            "prompt": [{"role": "user", "content": f"What is $6 \\cdot 7$? {PAPER_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "42"},
            "extra_info": {"index": 0, "split": "train"},
        },
        {
            "data_source": "DigitalLearningGmbH/MATH-lighteval",
            "prompt": [{"role": "user", "content": f"Simplify $\\frac{{4}}{{6}}$. {PAPER_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "\\frac{2}{3}"},
            "extra_info": {"index": 1, "split": "train"},
        },
    ]
    path = tmp_path / "train.parquet"
    pd.DataFrame(records).to_parquet(path)
    items = load_tasks(f"file:{path}", name="math")
    assert [i.question for i in items] == ["What is $6 \\cdot 7$?", "Simplify $\\frac{4}{6}$."]
    assert [i.answer for i in items] == ["42", "\\frac{2}{3}"]
    assert items[0].source == "math"


def test_json_and_jsonl_round_trip_and_subset(tmp_path):
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(20)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "b.json").write_text(json.dumps(rows))
    a, b = load_tasks(f"file:{tmp_path / 'a.jsonl'}"), load_tasks(f"file:{tmp_path / 'b.json'}")
    assert [i.answer for i in a] == [i.answer for i in b] == [str(i + 1) for i in range(20)]
    sub = load_tasks(f"file:{tmp_path / 'a.jsonl'}", n=5, seed=1)
    assert len(sub) == 5 and sub == load_tasks(f"file:{tmp_path / 'a.jsonl'}", n=5, seed=1)
    assert [int(i.answer) for i in sub] == sorted(int(i.answer) for i in sub)  # file order kept


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_json_names_file_and_line():
    with pytest.raises(ValueError, match=r"bad_json\.jsonl:3: invalid JSON"):
        load_tasks(f"file:{DATA / 'bad_json.jsonl'}")


def test_missing_answer_names_line_fields_and_accepted_names():
    with pytest.raises(
        ValueError, match=r"missing_answer\.jsonl:2: no answer; looked for \['answer'.*'notes'"
    ):
        load_tasks(f"file:{DATA / 'missing_answer.jsonl'}")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("x.csv", "question,answer\n", r"unknown file type '\.csv'; accepted: \['\.jsonl'"),
        ("x.json", '{"foo": 1}', r"list of objects.*\['foo'\]"),
        ("x.jsonl", '["not", "an", "object"]', r"x\.jsonl:1: expected a JSON object"),
        ("x.jsonl", '{"answer": "2"}', r"x\.jsonl:1: no question; looked for"),
        ("x.jsonl", "\n\n", r"holds no items"),
    ],
)
def test_malformed_files(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        load_tasks(f"file:{tmp_path / name}")


def test_missing_file_and_unknown_benchmark():
    with pytest.raises(FileNotFoundError, match="no task file at"):
        load_tasks("file:/nonexistent/tasks.jsonl")
    with pytest.raises(ValueError, match=r"unknown benchmark 'aime2024'; valid names: \['math'"):
        loaders.load_benchmark("aime2024")


# ------------------------------------------------------------------------------------- file splits (no leak)


def _numbered_file(tmp_path: Path, n: int = 200) -> Path:
    path = tmp_path / "numbered.jsonl"
    path.write_text(
        "\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(n))
    )
    return path


def test_a_file_by_split_is_disjoint_and_covers_the_file(tmp_path):
    path = _numbered_file(tmp_path)
    train, test = load_tasks(f"file:{path}", split="train"), load_tasks(f"file:{path}", split="test")
    assert {i.question for i in train}.isdisjoint({i.question for i in test})
    assert len(train) + len(test) == 200 and 20 <= len(test) <= 60  # 20 % held out by hash
    assert len(load_tasks(f"file:{path}")) == 200  # no split: the whole file
    assert len(load_tasks(f"file:{path}", split="test", holdout="none")) == 200


def test_a_file_too_small_to_hold_out_is_an_error(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}))
    empty = "test" if split_of("What is 1 + 1?") == "train" else "train"
    with pytest.raises(
        ValueError, match=rf"none of its 1 questions falls in the '{empty}' part of the hash split"
    ):
        load_tasks(f"file:{path}", split=empty)
    with pytest.raises(ValueError, match=r"holdout = 'half' is not allowed: 'hash': .*'none': "):
        load_tasks(f"file:{path}", split="train", holdout="half")


def test_check_disjoint_names_the_shared_questions(tmp_path):
    from workbench.tasks.sources import check_disjoint

    items = load_tasks(f"file:{_numbered_file(tmp_path, 10)}")
    check_disjoint(items[:5], items[5:], "eval")
    with pytest.raises(ValueError, match=r"eval: 2 of 5 held-out questions are also training questions"):
        check_disjoint(items[:5], items[3:8], "eval")
