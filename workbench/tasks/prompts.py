"""Prompt construction and the stable train/test split shared by every generated task source."""

from __future__ import annotations

import hashlib

PAPER_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""The instruction appended to every question in the paper (App. A)."""


TEST_FRACTION_PERCENT = 20
"""Share of the embedded (and gym) problem space, by stable hash of the question, that is held out."""


_SPLITS = ("train", "test")


def build_prompt(question: str, instruction: str | None = PAPER_INSTRUCTION) -> str:
    """Builds the user content of a prompt: the question, then the instruction.

    Args:
        question: The problem text.
        instruction: Appended after a space; ``None`` or ``""`` gives the question alone (tiny char-level
            agents use this on the embedded task).

    Returns:
        The user content, not yet formatted with any chat template.
    """
    if not instruction:
        return question
    return f"{question} {instruction}"


def split_of(text: str) -> str:
    """Assigns a problem to ``"train"`` or ``"test"`` by a stable hash of its canonical text.

    The same text always lands in the same split, so train and held-out sets can never share an item,
    whatever the seed or size asked for.
    """
    digest = hashlib.sha1(text.strip().encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_FRACTION_PERCENT else "train"


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"split={split!r} is not valid; expected one of {list(_SPLITS)}")
