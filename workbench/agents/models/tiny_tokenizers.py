"""Tokenizers of the tiny zoo, built offline with the ``tokenizers`` library.

- ``char``: one token per character of printable ASCII plus newline; anything else is ``<unk>``.
- ``bpe``: a byte-level BPE (every string encodable, nothing unknown) trained on the embedded task's prompts
  and worked solutions, the same corpus for every preset (so presets of one family share a tokenizer).

Both have ``<pad>`` and ``<eos>``; neither adds special tokens when encoding (no BOS).
"""

from __future__ import annotations

from typing import Any

from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.prompts import build_prompt

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHAR_ALPHABET = [chr(i) for i in range(32, 127)] + ["\n"]
BPE_CORPUS_PROBLEMS = 5000
"""Train problems (fixed seed 0) whose prompts and solutions train the BPE."""


def char_tokenizer() -> Any:
    """A character-level tokenizer over printable ASCII + newline (unknown characters -> ``<unk>``)."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHAR_ALPHABET)}
    # A BPE model without merges splits into single characters; Fuse joins them back without separators.
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def bpe_tokenizer(vocab_size: int, prompt_template: str) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens trained on embedded-task prompts and solutions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    items = embedded_task("train", BPE_CORPUS_PROBLEMS, seed=0)
    # Prompts and responses are encoded separately everywhere (generation, sharing, warm start): train so.
    corpus = [prompt_template.format(content=build_prompt(item.question, instruction=None)) for item in items]
    corpus += [item.solution or "" for item in items]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS[:2],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def build_tokenizer(kind: str, bpe_vocab: int, prompt_template: str) -> Any:
    """A transformers fast tokenizer of kind ``char`` or ``bpe`` (``<pad>``, ``<eos>``, no chat template)."""
    from transformers import PreTrainedTokenizerFast

    if kind == "char":
        backend, extra = char_tokenizer(), {"unk_token": "<unk>"}
    elif kind == "bpe":
        backend, extra = bpe_tokenizer(bpe_vocab, prompt_template), {}
    else:
        raise ValueError(f"tokenizer kind {kind!r} is not one of ['char', 'bpe']")
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", **extra)
