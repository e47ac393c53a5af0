"""Rewards: extraction, a table of tricky equivalent / non-equivalent pairs, the strict grader, and
adversarial completions under a time bound, from the main thread and from a worker thread."""

from __future__ import annotations

import random
import threading
import time

import pytest

from workbench.tasks import verifier
from workbench.tasks.rewards import (
    REASONS,
    REWARD_METHODS,
    Grade,
    as_number,
    extract_answer,
    grade,
    grade_batch,
    last_boxed,
    math_normalize,
)

TIME_BOUND_S = 3.0

# ---------------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{11}.", "11"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed 7 is it", "7"),
        ("\\fbox{3}", "3"),
        ("$\\boxed{x = 4}$.", "x = 4"),
        ("work\n#### 1,234\n", "1,234"),
        ("The answer is $-5$.", "-5"),
        ("Hence the final answer is: 12.", "12"),
        ("The answer is 0.25. Check: 1/4 = 0.25.", "0.25"),
        ("\\boxed{3} and later \\boxed{4", None),  # an unclosed last box is no answer (as in verl)
        ("no answer here", None),
        ("\\boxed{}", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_last_boxed_handles_deep_nesting_in_linear_time():
    text = "x" * 50_000 + "\\boxed{" + "{" * 3000 + "7" + "}" * 3000 + "}"
    t0 = time.perf_counter()
    assert last_boxed(text) == "{" * 3000 + "7" + "}" * 3000
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12", 12),
        ("-3", -3),
        ("−3", -3),
        ("0.50", 0.5),
        ("1,234", 1234),
        ("1{,}234", 1234),
        ("$7$", 7),
        ("1,2", None),
    ],
)
def test_as_number(text, value):
    got = as_number(text)
    assert (got is None) if value is None else (got == value)


# ---------------------------------------------------------------------------------------------- verification

EQUIVALENT = [  # (model answer, gold)
    ("0.5", "\\frac{1}{2}"),  # fraction vs decimal
    ("\\dfrac{3}{4}", "0.75"),
    ("\\frac12", "\\frac{1}{2}"),  # \frac shorthand
    ("1/2", "\\frac{1}{2}"),  # \frac vs /
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("-3", "-3"),  # negatives, unicode minus
    ("−3", "-3"),
    ("\\frac{-1}{3}", "-\\frac{1}{3}"),
    ("1,000", "1000"),  # thousands separators
    ("1{,}000", "1000"),
    ("10000", "10,000"),
    ("3.0", "3"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),  # sets
    ("[0, 1)", "[0,1)"),  # intervals
    ("(-\\infty, 2]", "(-\\infty,2]"),
    ("2\\sqrt{2}", "\\sqrt{8}"),  # \sqrt
    ("5 \\text{ cm}", "5"),  # units
    ("45^\\circ", "45"),
    ("50\\%", "50"),
    ("x = 4", "4"),
    ("2\\pi", "2\\pi"),
    ("x^2+2x+1", "(x+1)^2"),
]
NOT_EQUIVALENT = [
    ("0.5", "\\frac{1}{3}"),
    ("0.333", "\\frac{1}{3}"),
    ("3", "\\frac{10}{3}"),
    ("-\\frac{1}{2}", "\\frac{1}{2}"),
    ("-3", "3"),
    ("1,000", "100"),
    ("\\{1, 2\\}", "\\{1, 3\\}"),
    ("[0, 1)", "(0, 1)"),
    ("(0,1]", "[0,1]"),
    ("\\sqrt{2}", "2"),
    ("2\\pi", "\\pi"),
    ("x+1", "x-1"),
    ("5 \\text{ cm}", "6"),
]


def test_equivalent_pairs_are_correct():
    grades = grade_batch([f"So \\boxed{{{a}}}." for a, _ in EQUIVALENT], [g for _, g in EQUIVALENT])
    wrong = [(pair, g.reason) for pair, g in zip(EQUIVALENT, grades) if g != Grade(1.0, "correct")]
    assert not wrong


def test_non_equivalent_pairs_are_wrong():
    grades = grade_batch([f"So \\boxed{{{a}}}." for a, _ in NOT_EQUIVALENT], [g for _, g in NOT_EQUIVALENT])
    bad = [(pair, g.reason) for pair, g in zip(NOT_EQUIVALENT, grades) if g != Grade(0.0, "wrong")]
    assert not bad


def test_single_grade_matches_batch_and_other_extractions():
    assert grade("2+3=5\n#### 5", "5") == Grade(1.0, "correct")
    assert grade("The answer is 0.5", "\\frac{1}{2}").reward == 1.0
    assert grade("I give up", "5") == Grade(0.0, "no_answer")
    assert grade("\\boxed{abc\x00}", "5") == Grade(0.0, "malformed")


@pytest.mark.parametrize(
    ("completion", "gold", "reason"),
    [
        ("\\boxed{\\frac12}", "\\frac{1}{2}", "correct"),
        ("\\boxed{\\dfrac{3}{4}}", "\\frac34", "correct"),
        ("\\boxed{x = 4}", "4", "correct"),
        ("\\boxed{5 \\text{ cm}}", "5", "correct"),
        ("\\boxed{.5}", "0.5", "correct"),
        ("\\boxed{1/2}", "\\frac{1}{2}", "correct"),
        ("\\boxed{90^\\circ}", "90", "correct"),
        ("\\boxed{0.5}", "\\frac{1}{2}", "wrong"),  # strict: no numeric equivalence
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", "wrong"),
        ("#### 5", "5", "no_answer"),  # the authors' grader reads only \boxed
        ("the answer is 5", "5", "no_answer"),
    ],
)
def test_boxed_exact_is_the_strict_grader(completion, gold, reason):
    assert grade(completion, gold, method="boxed_exact").reason == reason


def test_numeric_method():
    assert grade("\\boxed{1,000}", "1000", method="numeric") == Grade(1.0, "correct")
    assert grade("\\boxed{7}", "8", method="numeric") == Grade(0.0, "wrong")
    assert grade("\\boxed{\\frac{1}{2}}", "0.5", method="numeric").reason == "malformed"


def test_unknown_method_and_length_mismatch_are_errors():
    with pytest.raises(ValueError, match=r"task.reward = 'exact' is not allowed: one of \['math_verify'"):
        grade("\\boxed{1}", "1", method="exact")
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        grade_batch(["a", "b"], ["1"])
    assert set(REWARD_METHODS) >= {"math_verify", "boxed_exact", "numeric"}


def test_fast_path_skips_math_verify(monkeypatch):
    def boom(pairs):
        raise AssertionError(f"math-verify called for {pairs}")

    monkeypatch.setattr(verifier, "verify_pairs", boom)
    grades = grade_batch(
        [f"\\boxed{{{i}}}" for i in range(1024)], [str(i if i % 2 else i + 1) for i in range(1024)]
    )
    assert [g.reward for g in grades] == [float(i % 2) for i in range(1024)]


# ---------------------------------------------------------------------------------------------- adversarial


def _adversarial() -> list[tuple[str, str, str]]:
    rng = random.Random(0)
    junk = "".join(chr(rng.randrange(1, 0x3000)) for _ in range(30_000))
    return [
        ("long text, no answer", "blah " * 10_000, "5"),
        ("5,000 nested braces", "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
        ("40k-char answer", "\\boxed{" + "1+" * 20_000 + "1}", "20001"),
        ("power tower", "\\boxed{9^{9^{9^{9}}}}", "5"),
        ("huge power", "\\boxed{2^{100000000}}", "1"),
        ("huge factorial", "\\boxed{(10^{10})!}", "\\frac{1}{2}"),
        ("\\frac chain", "\\boxed{" + "\\frac{1}{" * 20 + "2" + "}" * 20 + "}", "\\frac{1}{2}"),
        ("deep \\frac chain", "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}", "\\frac{1}{2}"),
        ("integral", "\\boxed{\\int_0^{\\infty} e^{-x^{100}} \\sin(x^{50}) dx}", "1"),
        ("binary junk", junk, "1"),
        ("boxed junk", "\\boxed{" + junk[:300].replace("{", "").replace("}", "") + "}", "1"),
        ("control characters", "\\boxed{" + "".join(map(chr, range(1, 32))) + "}", "1"),
        ("unclosed boxes", "\\boxed{" * 5000, "1"),
        ("null bytes", "\x00" * 20_000 + "\\boxed{\x00}", "0"),
    ]


@pytest.fixture(scope="module")
def warm_verifier():
    verifier.start()
    assert grade("\\boxed{\\frac{2}{4}}", "0.5").reward == 1.0  # workers up before the timed cases


def test_adversarial_completions_return_within_the_bound(warm_verifier):
    for name, completion, gold in _adversarial():
        t0 = time.perf_counter()
        result = grade(completion, gold)
        elapsed = time.perf_counter() - t0
        assert result.reward == 0.0 and result.reason in REASONS, name
        assert elapsed < TIME_BOUND_S, f"{name}: {elapsed:.2f} s"
    assert grade("\\boxed{\\frac{1}{2}}", "0.5").reward == 1.0  # the pool still works after the kills


def test_adversarial_batch_from_a_thread_never_raises(warm_verifier):
    cases = [
        c for c in _adversarial() if c[0] not in ("power tower", "huge power", "huge factorial", "integral")
    ]
    cases += [("equivalent", "\\boxed{\\frac{1}{2}}", "0.5")]
    out: dict[str, object] = {}

    def work():
        try:
            out["grades"] = grade_batch([c for _, c, _ in cases], [g for _, _, g in cases])
        except BaseException as e:  # the test fails on any exception, reported below
            out["error"] = e

    thread = threading.Thread(target=work)
    t0 = time.perf_counter()
    thread.start()
    thread.join(timeout=TIME_BOUND_S * len(cases))
    assert not thread.is_alive() and "error" not in out, out.get("error")
    assert [g.reward for g in out["grades"]] == [0.0] * (len(cases) - 1) + [1.0]
    assert time.perf_counter() - t0 < TIME_BOUND_S * 2


def test_a_timeout_in_a_thread_is_bounded(warm_verifier):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("g", grade("\\boxed{9^{9^{9^{9}}}}", "5")))
    t0 = time.perf_counter()
    thread.start()
    thread.join(timeout=10)
    assert out["g"] == Grade(0.0, "timeout")
    assert time.perf_counter() - t0 < TIME_BOUND_S


def test_dead_workers_are_replaced(warm_verifier):
    pool = verifier._shared_pool()
    for w in pool.workers:  # processes this test session started
        w.proc.kill()
        w.proc.wait()
    assert grade("\\boxed{\\frac{3}{6}}", "0.5") == Grade(1.0, "correct")
    assert all(w.proc.poll() is None for w in pool.workers)


def test_non_string_input_never_raises():
    grades = grade_batch([None, 12, "\\boxed{3}"], ["1", "12", 3])  # type: ignore[list-item]
    assert [g.reason for g in grades] == ["no_answer", "no_answer", "correct"]


def test_math_normalize_examples():
    assert math_normalize("\\left( 1, 2 \\right)") == "(1,2)"
    assert math_normalize("\\tfrac{1}{2}") == math_normalize("\\frac12") == "\\frac{1}{2}"
    assert math_normalize("\\sqrt3") == "\\sqrt{3}"
    assert math_normalize("10\\%") == "10"


# ----------------------------------------------------------------------------------------- custom rewards

CUSTOM = '''
from workbench.tasks.rewards import Grade, as_number, extract_answer


def within_one(completion, answer):
    """1 when the final answer is within 1 of the gold number (the example of docs/tasks.md)."""
    got = extract_answer(completion)
    value = as_number(got) if got else None
    return float(value is not None and abs(value - as_number(answer)) <= 1)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature."""
    return solution_str.strip().endswith(ground_truth)


def half(completion, answer):
    return 0.5


def out_of_range(completion, answer):
    return 3.0


def needs_three(completion, answer, third):
    return 1.0
'''


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_h13.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_h13"


def test_a_custom_reward_grades_and_counts_as_correct_above_one_half(custom_module):
    grades = grade_batch(
        ["\\boxed{41}", "\\boxed{45}", "no answer"], ["42"] * 3, method=f"{custom_module}:within_one"
    )
    assert grades == [Grade(1.0, "correct"), Grade(0.0, "wrong"), Grade(0.0, "wrong")]
    assert grade("x", "1", method=f"{custom_module}:half") == Grade(0.5, "wrong")
    assert grade("so 42", "42", method=f"{custom_module}:compute_score") == Grade(1.0, "correct")  # verl


def test_a_custom_reward_outside_0_1_is_malformed_not_a_crash(custom_module):
    assert grade("x", "1", method=f"{custom_module}:out_of_range") == Grade(0.0, "malformed")


def test_a_custom_reward_is_checked_when_the_config_loads(custom_module):
    from workbench.config.checks import ConfigError
    from workbench.config.experiment import TaskConfig

    assert TaskConfig(reward=f"{custom_module}:within_one").reward == f"{custom_module}:within_one"
    cases = {
        "no_such_module_h13:fn": r"module 'no_such_module_h13' does not import \(ModuleNotFoundError",
        f"{custom_module}:nope": r"has no function 'nope'; its functions: \[.*'within_one'\]",
        f"{custom_module}:needs_three": r"failed with TypeError: .*takes \(completion: str, answer: str\)",
        f"{custom_module}:out_of_range": r"rewards must be in \[0, 1\]",
        "within one": r"task\.reward = 'within one' is not allowed: one of \['math_verify'.*module:function",
    }
    for spec, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            TaskConfig(reward=spec)
