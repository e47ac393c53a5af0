"""A tiny agent zoo: small transformers models with their own tokenizers, warm-started on the embedded task.

``load_agent("tiny:<preset>")`` builds a preset on first use (deterministically from its seed) and caches it
under ``$HACPO_CACHE/tiny/``. A build: tokenizer (character-level, or a byte-level BPE trained with
``tokenizers`` on the task text) → model from a transformers config → a short supervised warm start on worked
solutions of `workbench.tasks.arithmetic.embedded_task` (its default regime) → greedy accuracy on 1,000
held-out problems, written with the build time into ``card.json`` next to the weights (`read_card`,
`zoo_table`).

Presets cover the paper's three kinds of heterogeneity (Defs. 2.1-2.3), see `ZOO_PAIRS`:

| pair | agents | what differs |
|---|---|---|
| ``state`` | ``gpt2-char`` / ``gpt2-char-early`` | warm-start length only (same architecture, size, seed) |
| ``size`` | ``llama-bpe`` / ``llama-bpe-large`` | size (same family and tokenizer) |
| ``model`` | ``gpt2-char`` / ``llama-bpe`` | architecture and tokenizer (GPT-2 + chars vs Llama + BPE-400) |

Tiny agents use the plain prompt template (``"Q: {content}\\nA: "``) on the bare question (no instruction).
Setting ``HACPO_TINY_WARM_STEPS`` overrides every preset's warm-start steps (tests use it to build in
seconds); such builds are cached separately.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.agents.hf import build_agent
from workbench.agents.rollout import generate
from workbench.agents.tiny_tokenizers import build_tokenizer
from workbench.agents.tokens import pack
from workbench.config.agent_spec import DEFAULT_PROMPT_TEMPLATE, AgentSpec
from workbench.core.env import cache_root
from workbench.core.io import atomic_write_json
from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.prompts import build_prompt
from workbench.tasks.rewards import grade_batch

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


WARMUP_STEPS = 20
"""Linear learning-rate warm-up of every warm start, in steps (then constant)."""


def _lr_at(step: int, lr: float) -> float:
    """Linear warm-up over `WARMUP_STEPS` steps, then constant: the warm start stops mid-curve, not annealed.

    The schedule does not depend on the total step count, so a shorter build is an exact prefix of a longer
    one with the same seed (``gpt2-char-early`` is a snapshot of ``gpt2-char``'s own trajectory).
    """
    return lr * min(1.0, (step + 1) / WARMUP_STEPS)


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
    """Supervised warm start on worked solutions (loss on response tokens only); returns the final loss.

    Uses the agent's own prompt format and tokenization (`Agent.encode_prompt`, response ids + EOS), so the
    warm-started model sees prompts exactly as `workbench.agents.rollout.generate` will show them. Each step
    takes ``batch_size`` fresh i.i.d. problems of the default regime (``embedded_task`` is prefix-stable), so
    the data of a shorter build is a prefix of a longer one's. ``callback(step, agent)`` is called every
    ``callback_every`` steps (calibration curves).
    """

    if steps == 0:
        return float("nan")
    items = embedded_task("train", steps * batch_size, seed=seed)
    pairs = [
        (
            agent.encode_prompt(build_prompt(item.question, instruction=None)),
            [*agent.tokenizer.encode(item.solution, add_special_tokens=False), agent.eos_token_id],
        )
        for item in items
    ]
    optimizer = torch.optim.AdamW(agent.model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = pack(pairs[step * batch_size : (step + 1) * batch_size], agent.pad_token_id)
        # An all-ones mask is exact here (right padding + causal attention: no real token sees a pad, and pads
        # carry no loss) and lets the fused causal attention path run (~10% faster on CPU).
        ones_B_T = torch.ones_like(batch.input_ids_B_T)
        logits_B_T_V = agent.model(input_ids=batch.input_ids_B_T, attention_mask=ones_B_T).logits
        mask_B_T = batch.response_mask_B_T[:, 1:].bool()
        loss = torch.nn.functional.cross_entropy(
            logits_B_T_V[:, :-1][mask_B_T], batch.input_ids_B_T[:, 1:][mask_B_T]
        )
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, lr)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.model.parameters(), 1.0)
        optimizer.step()
        if callback is not None and callback_every and (step + 1) % callback_every == 0:
            callback(step + 1, agent)
    return float(loss.detach())


def greedy_accuracy(agent: Any, n: int = EVAL_PROBLEMS, *, seed: int = 0) -> float:
    """Greedy accuracy on ``n`` held-out embedded problems (bare questions, math-verify grading)."""

    items = embedded_task("test", n, seed=seed)
    prompts = [build_prompt(item.question, instruction=None) for item in items]
    rollouts = generate(agent, prompts, n=1, temperature=0.0)
    grades = grade_batch([r.text for r in rollouts], [item.answer for item in items])
    return sum(g.reward for g in grades) / len(grades)


def _build_into(name: str, preset: TinyPreset, steps: int, out_dir: Path) -> dict[str, Any]:

    start = time.perf_counter()
    _init_model_dir(preset, out_dir)
    agent = build_agent(AgentSpec(model=str(out_dir), name=name, device="cpu", dtype="float32"), str(out_dir))
    n_params = sum(p.numel() for p in agent.model.parameters())
    # Data order and dropout-free training are seeded; with a fixed thread count the build is reproducible.
    torch.manual_seed(preset.seed)
    final_loss = warm_start(agent, steps, lr=preset.lr, batch_size=preset.batch_size, seed=preset.seed)
    agent.model.save_pretrained(out_dir)
    accuracy = greedy_accuracy(agent)
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
    if (target / CARD).is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        card = _build_into(preset_name, preset, steps, scratch)
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(scratch, target)
        except OSError:
            if not (target / CARD).is_file():  # another process finished the same build first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    logger.info(
        "built tiny:%s in %.1f s: %d parameters, greedy accuracy %.3f",
        preset_name, card["build_seconds"], card["parameters"], card["initial_greedy_accuracy"],
    )  # fmt: skip
    return target


def read_card(path: Path | str) -> dict[str, Any]:
    """The ``card.json`` of a built tiny agent directory."""
    return json.loads((Path(path) / CARD).read_text())


def zoo_table(*, cache_dir: Path | str | None = None, warm_steps: int | None = None) -> list[dict[str, Any]]:
    """One row per preset: its description and, when built, its card's accuracy and build time.

    ``warm_steps`` looks up builds made with that override (as `build_tiny` caches them) instead of the
    presets' own warm-start steps.
    """
    rows = []
    for name, preset in TINY_PRESETS.items():
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
