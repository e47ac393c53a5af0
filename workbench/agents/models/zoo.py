"""A tiny agent zoo: small transformers models with their own tokenizers, warm-started on the embedded task.

``load_agent("tiny:<preset>")`` loads the preset's weights shipped in the repository (``zoo/tiny/<preset>/``,
`workbench.agents.models.shipped`), so every machine starts from the same agents and the numbers on their
cards. `build_tiny` rebuilds a preset on this machine (deterministically from its seed on one machine, but not
bit for bit across CPUs) and caches it under ``$HACPO_CACHE/tiny/``; ``python -m workbench zoo build
tiny:<preset>`` does that and reports how far the rebuild lands from the shipped card.

A build: tokenizer (character-level, or a byte-level BPE trained with ``tokenizers`` on the task text) →
model from a transformers config → a short supervised warm start on worked solutions of
`workbench.tasks.arithmetic.embedded_task` (its default regime) → greedy accuracy on 1,000 held-out problems,
written with the build time and the machine into ``card.json`` next to the weights (`read_card`,
`zoo_table`).

Presets cover the paper's three kinds of heterogeneity (Defs. 2.1-2.3), see `ZOO_PAIRS`:

| pair | agents | what differs |
|---|---|---|
| ``state`` | ``gpt2-char`` / ``gpt2-char-early`` | warm-start length only (same architecture, size, seed) |
| ``size`` | ``llama-bpe`` / ``llama-bpe-large`` | size (same family and tokenizer) |
| ``model`` | ``gpt2-char`` / ``llama-bpe`` | architecture and tokenizer (GPT-2 + chars vs Llama + BPE-400) |

Tiny agents use the plain prompt template (``"Q: {content}\\nA: "``) on the bare question (no instruction).
Setting ``HACPO_TINY_WARM_STEPS`` overrides every preset's warm-start steps (tests use it to build in
seconds): ``tiny:<preset>`` then builds that variant into the cache instead of loading the shipped one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.agents.models.hf import build_agent
from workbench.agents.models.shipped import build_once, ship, shipped_card, shipped_dir
from workbench.agents.models.tiny_tokenizers import build_tokenizer
from workbench.agents.models.warm import greedy_accuracy, solution_pairs, supervised_steps
from workbench.config.agent_spec import DEFAULT_PROMPT_TEMPLATE, AgentSpec
from workbench.core.env import cache_root
from workbench.core.io import atomic_write_json
from workbench.core.machine import machine_info
from workbench.tasks.arithmetic import embedded_task

logger = logging.getLogger(__name__)

ZOO_VERSION = 3
"""Bumped when the build recipe changes: cached builds of another version are rebuilt."""
EVAL_PROBLEMS = 1000
"""Held-out embedded problems of the initial-accuracy figure in ``card.json``."""
CARD = "card.json"


@dataclass(frozen=True)
class TinyPreset:
    """How to build one tiny agent (every number fixed, so a build is reproducible)."""

    architecture: str
    """``gpt2``, ``llama`` or ``qwen2``."""
    tokenizer: str
    """``char`` (printable ASCII + newline) or ``bpe`` (byte-level BPE trained on the task text)."""
    layers: int
    hidden: int
    heads: int
    warm_steps: int
    """Supervised warm-start steps (batch ``batch_size``)."""
    seed: int
    """Seed of initialization and warm-start data order."""
    intermediate: int = 0
    """MLP width (Llama/Qwen2); GPT-2 uses 4 x hidden."""
    bpe_vocab: int = 400
    lr: float = 3e-3
    batch_size: int = 32
    max_new_tokens: int = 48
    """Response cap written into the generation config (solutions are <= 42 characters)."""
    description: str = ""


TINY_PRESETS: dict[str, TinyPreset] = {
    "gpt2-char": TinyPreset(
        "gpt2", "char", layers=2, hidden=128, heads=4, warm_steps=575, seed=0, lr=1.5e-3,
        description="GPT-2, 2 layers, d=128, character-level (0.44M)",
    ),
    "gpt2-char-early": TinyPreset(
        "gpt2", "char", layers=2, hidden=128, heads=4, warm_steps=475, seed=0, lr=1.5e-3,
        description="gpt2-char stopped 100 warm-start steps earlier (state heterogeneity)",
    ),
    "llama-bpe": TinyPreset(
        "llama", "bpe", layers=2, hidden=128, heads=4, intermediate=384, warm_steps=220, seed=1, lr=1.5e-3,
        description="Llama, 2 layers, d=128, byte-level BPE-400 (0.47M)",
    ),
    "llama-bpe-large": TinyPreset(
        "llama", "bpe", layers=4, hidden=192, heads=4, intermediate=512, warm_steps=220, seed=1, lr=1e-3,
        description="Llama, 4 layers, d=192, byte-level BPE-400 (1.83M)",
    ),
}  # fmt: skip

ZOO_PAIRS: dict[str, tuple[str, str]] = {
    "state": ("gpt2-char", "gpt2-char-early"),
    "size": ("llama-bpe", "llama-bpe-large"),
    "model": ("gpt2-char", "llama-bpe"),
}
"""The paper's three kinds of heterogeneity (Defs. 2.1-2.3), as preset pairs."""


def tiny_preset(name: str) -> TinyPreset:
    """Looks up a preset; an unknown name raises a `KeyError` listing the presets."""
    if name not in TINY_PRESETS:
        raise KeyError(
            f"unknown tiny preset {name!r}; tiny presets are {sorted(TINY_PRESETS)} ('tiny:<name>')"
        )
    return TINY_PRESETS[name]


def _warm_steps(preset: TinyPreset, override: int | None) -> int:
    steps = preset.warm_steps if override is None else override
    if steps < 0:
        raise ValueError(f"warm_steps={steps} is not allowed: an integer >= 0")
    return steps


def tiny_dir(name: str, *, cache_dir: Path | str | None = None, warm_steps: int | None = None) -> Path:
    """Where a preset's build is cached: one directory per (preset, warm steps, recipe version)."""
    preset = tiny_preset(name)
    steps = _warm_steps(preset, warm_steps)
    recipe = json.dumps([ZOO_VERSION, dataclasses.asdict(preset), steps], sort_keys=True)
    digest = hashlib.sha1(recipe.encode()).hexdigest()[:8]
    return Path(cache_dir or cache_root()) / "tiny" / f"{name}-w{steps}-{digest}"


def _model_config(preset: TinyPreset, tokenizer: Any) -> Any:
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    ids = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
    }
    if preset.architecture == "gpt2":
        return GPT2Config(
            n_positions=256, n_embd=preset.hidden, n_layer=preset.layers, n_head=preset.heads,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_pytorch_tanh", **ids,
        )  # fmt: skip
    family = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if preset.architecture not in family:
        raise ValueError(f"architecture {preset.architecture!r} is not one of ['gpt2', *{sorted(family)}]")
    return family[preset.architecture](
        hidden_size=preset.hidden, intermediate_size=preset.intermediate, num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads, num_key_value_heads=preset.heads, max_position_embeddings=256,
        attention_dropout=0.0, **ids,
    )  # fmt: skip


def _init_model_dir(preset: TinyPreset, out_dir: Path) -> None:
    """Writes an untrained model + tokenizer directory loadable with ``from_pretrained``."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tokenizer(preset.tokenizer, preset.bpe_vocab, DEFAULT_PROMPT_TEMPLATE)
    torch.manual_seed(preset.seed)
    model = AutoModelForCausalLM.from_config(_model_config(preset, tokenizer))
    model.generation_config = GenerationConfig(
        max_new_tokens=preset.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def warm_start(
    agent: Any,
    steps: int,
    *,
    lr: float,
    batch_size: int,
    seed: int,
    callback: Callable[[int, Any], None] | None = None,
    callback_every: int = 0,
) -> float:
    """Supervised warm start of every weight on worked solutions; returns the final loss.

    Each step takes ``batch_size`` fresh i.i.d. problems of the default regime (``embedded_task`` is
    prefix-stable), so the data of a shorter build is a prefix of a longer one's; the prompts are the bare
    questions in the agent's own format, as rollouts show them (`workbench.agents.models.warm`).
    """
    if steps == 0:
        return float("nan")
    items = embedded_task("train", steps * batch_size, seed=seed)
    return supervised_steps(
        agent, solution_pairs(agent, items, instruction=None), steps, lr=lr, batch_size=batch_size,
        callback=callback, callback_every=callback_every,
    )  # fmt: skip


def _build_into(name: str, preset: TinyPreset, steps: int, out_dir: Path) -> dict[str, Any]:

    start = time.perf_counter()
    _init_model_dir(preset, out_dir)
    agent = build_agent(AgentSpec(model=str(out_dir), name=name, device="cpu", dtype="float32"), str(out_dir))
    n_params = sum(p.numel() for p in agent.model.parameters())
    # Data order and dropout-free training are seeded; with a fixed thread count the build is reproducible.
    torch.manual_seed(preset.seed)
    final_loss = warm_start(agent, steps, lr=preset.lr, batch_size=preset.batch_size, seed=preset.seed)
    agent.model.save_pretrained(out_dir)
    accuracy = greedy_accuracy(agent, EVAL_PROBLEMS)
    card = {
        "preset": name,
        **dataclasses.asdict(preset),
        "warm_steps": steps,
        "parameters": n_params,
        "vocab_size": len(agent.tokenizer),
        "prompt_template": DEFAULT_PROMPT_TEMPLATE,
        "instruction": None,
        "final_sft_loss": round(final_loss, 4),
        "initial_greedy_accuracy": accuracy,
        "eval_problems": EVAL_PROBLEMS,
        "build_seconds": round(time.perf_counter() - start, 1),
        "zoo_version": ZOO_VERSION,
        "built_on": machine_info(),
    }
    atomic_write_json(out_dir / CARD, card)
    return card


def build_tiny(
    preset_name: str,
    *,
    cache_dir: Path | str | None = None,
    warm_steps: int | None = None,
    force: bool = False,
) -> Path:
    """Builds (or finds cached) a tiny agent; returns its model directory.

    Args:
        preset_name: A key of `TINY_PRESETS`.
        cache_dir: Cache root; None = ``$HACPO_CACHE`` (default ``~/.cache/hacpo-workbench``).
        warm_steps: Overrides the preset's warm-start steps (else ``$HACPO_TINY_WARM_STEPS``, else the
            preset's).
        force: Rebuild even when cached.

    Returns:
        A directory with the model, tokenizer, generation config and ``card.json``.

    Raises:
        KeyError: Unknown preset (the message lists them).
    """
    preset = tiny_preset(preset_name)
    steps = _warm_steps(preset, warm_steps)
    target = tiny_dir(preset_name, cache_dir=cache_dir, warm_steps=steps)
    built = build_once(
        target,
        lambda scratch: _build_into(preset_name, preset, steps, scratch),
        complete=lambda folder: (folder / CARD).is_file(),
        force=force,
    )
    if built:
        card = read_card(target)
        logger.info(
            "built tiny:%s in %.1f s: %d parameters, greedy accuracy %.3f",
            preset_name, card["build_seconds"], card["parameters"], card["initial_greedy_accuracy"],
        )  # fmt: skip
    return target


def tiny_source(preset_name: str, *, warm_steps: int | None = None) -> Path:
    """The model directory ``tiny:<preset>`` loads: the shipped weights, or a cached build of a variant.

    With ``warm_steps`` (or ``$HACPO_TINY_WARM_STEPS``, which the caller passes) different from the preset's,
    or when the repository ships no weights for it, the preset is built on this machine (`build_tiny`).

    Raises:
        KeyError: Unknown preset (the message lists them).
        workbench.agents.models.shipped.ShippedError: Shipped files that do not match the manifest.
    """
    preset = tiny_preset(preset_name)
    if warm_steps is None or warm_steps == preset.warm_steps:
        folder = shipped_dir("tiny", preset_name)
        if folder is not None:
            return folder
        logger.warning(
            "tiny:%s: no shipped weights in this checkout (zoo/tiny/%s); building it here, so its accuracy "
            "may differ from the card of the repository", preset_name, preset_name,
        )  # fmt: skip
    return build_tiny(preset_name, warm_steps=warm_steps)


SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json")  # fmt: skip
"""Files of a tiny build that ship (``card.json`` is written from the card)."""


def rebuild_tiny(preset_name: str, *, ship_it: bool = False) -> dict[str, Any]:
    """Rebuilds a preset on this machine (fresh, into the cache) and compares it with the shipped card.

    Args:
        preset_name: A key of `TINY_PRESETS`.
        ship_it: Replace the shipped weights and card with the rebuild (maintainers, after a recipe change).

    Returns:
        ``agent``, ``shipped_accuracy``, ``rebuilt_accuracy``, ``delta``, ``same_weights`` (bit-identical
        to the shipped ``model.safetensors``), ``build_seconds`` and ``path`` of the rebuild.
    """
    path = build_tiny(preset_name, force=True)
    card = read_card(path)
    shipped = shipped_card("tiny", preset_name)
    shipped_path = shipped_dir("tiny", preset_name)
    same = None
    if shipped_path is not None:
        same = (shipped_path / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()
    if ship_it:
        ship(path, "tiny", preset_name, list(SHIPPED_FILES), card)
    acc = card["initial_greedy_accuracy"]
    shipped_acc = None if shipped is None else shipped["initial_greedy_accuracy"]
    return {
        "agent": f"tiny:{preset_name}",
        "shipped_accuracy": shipped_acc,
        "rebuilt_accuracy": acc,
        "delta": None if shipped_acc is None else round(acc - shipped_acc, 4),
        "same_weights": same,
        "build_seconds": card["build_seconds"],
        "path": str(path),
    }


def read_card(path: Path | str) -> dict[str, Any]:
    """The ``card.json`` of a built tiny agent directory."""
    return json.loads((Path(path) / CARD).read_text())


def zoo_table(*, cache_dir: Path | str | None = None, warm_steps: int | None = None) -> list[dict[str, Any]]:
    """One row per preset: its description and its card's accuracy and build time (shipped, or built).

    Without ``warm_steps`` the cards are the shipped ones; with it, those of builds made with that override
    (as `build_tiny` caches them).
    """
    rows = []
    for name, preset in TINY_PRESETS.items():
        card = shipped_card("tiny", name) if warm_steps is None and cache_dir is None else None
        if card is None:
            path = tiny_dir(name, cache_dir=cache_dir, warm_steps=warm_steps)
            card = read_card(path) if (path / CARD).is_file() else {}
        rows.append(
            {
                "preset": name,
                "description": preset.description,
                "warm_steps": _warm_steps(preset, warm_steps),
                "initial_greedy_accuracy": card.get("initial_greedy_accuracy"),
                "build_seconds": card.get("build_seconds"),
                "built": bool(card),
            }
        )
    return rows
