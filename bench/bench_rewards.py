"""Grading throughput and worst-case latency.

Prints the median time to grade 1,024 plain-integer responses through the fast exact path and through
math-verify (forced, in the worker pool, cache off), and the worst time over a set of adversarial
completions.

    .venv/bin/python bench/bench_rewards.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from workbench.tasks import verifier
from workbench.tasks.rewards import extract_answer, grade, grade_batch


def integer_batch(n: int = 1024, seed: int = 0) -> tuple[list[str], list[str]]:
    """Responses like the embedded task's: worked steps ending in a boxed integer, half of them right."""
    rng = random.Random(seed)
    completions, answers = [], []
    for _ in range(n):
        a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
        gold = a + b * c
        said = gold if rng.random() < 0.5 else gold + rng.choice([-1, 1])
        completions.append(f"{b}*{c}={b * c}, {a}+{b * c}={said}. \\boxed{{{said}}}")
        answers.append(str(gold))
    return completions, answers


def adversarial() -> dict[str, tuple[str, str]]:
    """Completions meant to hang or crash a grader (the same kinds as tests/test_rewards.py)."""
    rng = random.Random(0)
    junk = "".join(chr(rng.randrange(1, 0x3000)) for _ in range(30_000))
    return {
        "50k chars, no answer": ("blah " * 10_000, "5"),
        "5,000 nested braces": ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
        "40k-char sum": ("\\boxed{" + "1+" * 20_000 + "1}", "20001"),
        "power tower 9^9^9^9": ("\\boxed{9^{9^{9^{9}}}}", "5"),
        "2^(10^8)": ("\\boxed{2^{100000000}}", "1"),
        "(10^10)!": ("\\boxed{(10^{10})!}", "\\frac{1}{2}"),
        "\\frac chain x20": ("\\boxed{" + "\\frac{1}{" * 20 + "2" + "}" * 20 + "}", "\\frac{1}{2}"),
        "\\frac chain x200": ("\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}", "\\frac{1}{2}"),
        "integral": ("\\boxed{\\int_0^{\\infty} e^{-x^{100}} \\sin(x^{50}) dx}", "1"),
        "Gamma(10^10)": ("\\boxed{\\Gamma(10^{10})}", "1"),
        "binary junk": (junk, "1"),
        "control chars boxed": ("\\boxed{" + "".join(chr(i) for i in range(1, 32)) + "}", "1"),
        "5,000 unclosed boxes": ("\\boxed{" * 5000, "1"),
    }


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    completions, answers = integer_batch()
    fast = median_time(lambda: grade_batch(completions, answers), args.repeats)
    pairs = [(extract_answer(c), a) for c, a in zip(completions, answers)]
    verifier.verify_pairs([("\\frac{1}{2}", "0.5")])  # start the workers outside the timing

    def forced() -> None:
        verifier._shared_pool().cache.clear()  # measure math-verify itself, not the cache
        verifier.verify_pairs(pairs)

    slow = median_time(forced, max(1, args.repeats // 2))
    print(f"grade_batch, 1,024 plain-integer responses, fast path:       median {fast * 1e3:8.1f} ms")
    workers = f"{verifier.N_WORKERS} worker processes"
    print(f"same 1,024 through math-verify ({workers}):   median {slow * 1e3:8.1f} ms")
    print(f"ratio math-verify / fast path: {slow / fast:.0f}x")

    worst_name, worst = "", 0.0
    for name, (completion, gold) in adversarial().items():
        t0 = time.perf_counter()
        result = grade(completion, gold)
        elapsed = time.perf_counter() - t0
        print(f"  adversarial {name:24} {result.reason:10} {elapsed * 1e3:8.1f} ms")
        if elapsed > worst:
            worst_name, worst = name, elapsed
    limit = verifier.HARD_TIMEOUT_S
    print(f"worst adversarial case: {worst:.2f} s ({worst_name}); per-comparison hard limit {limit} s")


if __name__ == "__main__":
    main()
