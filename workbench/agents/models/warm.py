"""Supervised warm starts on worked solutions, and those of the embedded real models, stopped mid-curve.

One loop serves the tiny zoo (every weight trained) and the real models' LoRA warm starts (adapters only):
`supervised_steps` trains on ``(prompt ids, response ids)`` pairs with the loss on response tokens only, and
`greedy_accuracy` measures a model on held-out embedded problems exactly as rollouts will prompt it.

Out of the box the embedded models score near 0 on the embedded task (SmolLM2-135M-Instruct rambles, the
Gemma-3-270M base model continues the prompt), so RL has no signal to work with. A warm start teaches each one
the answer format and part of the skill: a LoRA adapter trained by `supervised_steps` on worked solutions of a
named task regime, stopped where greedy accuracy on 1,000 held-out items lies in the middle of the curve, like
the tiny zoo's warm starts.

``model: warm:<name>`` (`WARM_STARTS`) loads the embedded base model with the shipped adapter
(``zoo/warm/<name>/adapter_model.safetensors``, `workbench.agents.models.shipped`) merged into its weights;
the merged model is cached under ``$HACPO_CACHE/warm/`` on first use. An agent spec then puts its own, fresh
LoRA adapter on top for RL (so RL starts exactly at the warm start, and the KL reference of a LoRA agent, the
model with its adapters disabled, is the warm-started model).

A warm start was trained with one prompt format: use the same in the experiment (`WarmStart.agent_fields`
and `WarmStart.instruction`; the pre-flight check names any difference). ``python -m workbench zoo build
warm:<name>`` retrains it on this machine and reports how far it lands from the shipped card.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.agents.forward.tokens import pack
from workbench.agents.generation.rollout import generate
from workbench.agents.models.hf import build_agent, lora_config
from workbench.agents.models.shipped import build_once, ensure_embedded, ship, shipped_card, shipped_dir
from workbench.config.agent_spec import DEFAULT_PROMPT_TEMPLATE, AgentSpec, LoraSpec
from workbench.core.env import cache_root
from workbench.core.io import atomic_write_json
from workbench.core.machine import machine_info
from workbench.tasks.arithmetic import embedded_task
from workbench.tasks.prompts import build_prompt
from workbench.tasks.rewards import grade_batch

__all__ = [
    "WARMUP_STEPS",
    "WARM_STARTS",
    "WarmStart",
    "greedy_accuracy",
    "lr_at",
    "rebuild_warm",
    "solution_pairs",
    "supervised_steps",
    "warm_preset",
    "warm_source",
]

logger = logging.getLogger(__name__)

ADAPTER = "adapter_model.safetensors"
DONE_MARKER = "warm.json"
EVAL_PROBLEMS = 1000
QUICK_PROBLEMS = 100
"""The card also records greedy accuracy on the first 100 held-out items, which a test re-measures."""


@dataclass(frozen=True)
class WarmStart:
    """How one warm start is trained (every number fixed, so a build is reproducible on one machine)."""

    base: str
    """Embedded model it adapts (`workbench.agents.models.shipped.EMBEDDED_MODELS`)."""
    knobs: dict[str, Any]
    """Embedded-task knobs of its training and held-out problems (``regime`` and overrides)."""
    steps: int
    """Supervised steps (batch ``batch_size``), chosen to stop mid-curve."""
    lr: float
    """AdamW learning rate (after a 20-step linear warm-up, constant)."""
    system: str | None = None
    """System turn of its chat template (`AgentSpec.system`)."""
    chat_template: bool | None = None
    """`AgentSpec.chat_template`: None = the tokenizer's template when it has one."""
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    """Plain prompt format when no chat template applies."""
    instruction: str | None = None
    """Appended to each question (``task.instruction``); None = the bare question."""
    lora: LoraSpec = field(default_factory=lambda: LoraSpec(r=16, alpha=32.0, target_modules="all-linear"))
    """The adapter trained (merged into the base weights at load)."""
    batch_size: int = 16
    seed: int = 0
    """Seed of adapter initialization and of the training problems."""
    description: str = ""

    def agent_fields(self) -> dict[str, Any]:
        """The `AgentSpec` fields of the prompt format it was trained with."""
        return {
            "system": self.system,
            "chat_template": self.chat_template,
            "prompt_template": self.prompt_template,
        }


ARITH2 = {"regime": "addsub2"}

WARM_STARTS: dict[str, WarmStart] = {
    "smollm2-addsub2": WarmStart(
        base="smollm2-135m-instruct", knobs=ARITH2, steps=60, lr=2e-4, system="Solve the arithmetic problem.",
        description="SmolLM2-135M-Instruct, LoRA SFT on two-digit addsub2 worked solutions (ChatML)",
    ),
    "gemma3-addsub2": WarmStart(
        base="gemma3-270m", knobs=ARITH2, steps=150, lr=3e-4,
        description="Gemma-3-270M base, LoRA SFT on two-digit addsub2 worked solutions (plain Q/A format)",
    ),
}  # fmt: skip
"""Named warm starts (``model: warm:<name>``)."""


def warm_preset(name: str) -> WarmStart:
    """Looks up a warm start; an unknown name raises a `KeyError` listing them."""
    if name not in WARM_STARTS:
        raise KeyError(f"unknown warm start {name!r}; warm starts are {sorted(WARM_STARTS)} ('warm:<name>')")
    return WARM_STARTS[name]


def _student(preset: WarmStart, base_dir: Path, lora: LoraSpec | None) -> Any:
    """The base model as an agent in the warm start's prompt format, fp32 on CPU, with ``lora`` on top."""
    spec = AgentSpec(
        model=str(base_dir),
        lora=lora,
        device="cpu",
        dtype="float32",
        seed=preset.seed,
        **preset.agent_fields(),
    )
    return build_agent(spec, str(base_dir))


def _merge_into(preset: WarmStart, adapter: Path, out_dir: Path) -> None:
    """Writes the base model with ``adapter`` merged into its weights (+ tokenizer) into ``out_dir``."""
    from peft import get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = ensure_embedded(preset.base)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = get_peft_model(model, lora_config(preset.lora))
    result = set_peft_model_state_dict(model, load_file(adapter))
    if getattr(result, "unexpected_keys", None):
        raise KeyError(f"warm start adapter {adapter}: unexpected keys {result.unexpected_keys[:5]}")
    model.merge_and_unload().save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out_dir)


def _done(folder: Path) -> bool:
    return (folder / DONE_MARKER).is_file()


def warm_source(name: str, *, adapter_dir: Path | None = None) -> Path:
    """The merged model directory ``warm:<name>`` loads (built from the shipped adapter on first use).

    Args:
        name: A key of `WARM_STARTS`.
        adapter_dir: Where the adapter is; None = the shipped one (verified against the manifest).

    Raises:
        KeyError: Unknown warm start.
        workbench.agents.models.shipped.ShippedError: The shipped adapter does not match the manifest.
        workbench.agents.models.shipped.EmbeddedModelError: The base model's package is missing.
    """
    preset = warm_preset(name)
    folder = adapter_dir or shipped_dir("warm", name)
    if folder is None:
        raise FileNotFoundError(
            f"warm:{name} is not shipped in this checkout (zoo/warm/{name}); build it with "
            f"`python -m workbench zoo build warm:{name} --ship`"
        )
    adapter = folder / ADAPTER
    digest = _short_digest(adapter)
    target = cache_root() / "warm" / f"{name}-{digest}"
    if _done(target):
        return target

    def fill(scratch: Path) -> None:
        start = time.perf_counter()
        _merge_into(preset, adapter, scratch)
        info = {"warm_start": name, "adapter_sha256_prefix": digest, "seconds": time.perf_counter() - start}
        atomic_write_json(scratch / DONE_MARKER, info)

    logger.info("merging warm start %s into %s (first use only)", name, preset.base)
    build_once(target, fill, complete=_done)
    return target


def _short_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _save_adapter(student: Any, out_dir: Path) -> None:
    """The trained adapter in bfloat16 (half the bytes to ship; the card measures the rounded weights)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(student.model)
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}, out_dir / ADAPTER)


def _measure(name: str, preset: WarmStart, adapter_dir: Path) -> dict[str, Any]:
    """Greedy accuracy of the merged warm start on the first 1,000 and the first 100 held-out items."""
    agent = _student(preset, warm_source(name, adapter_dir=adapter_dir), None)
    kwargs = {"instruction": preset.instruction, "knobs": preset.knobs}
    return {
        "initial_greedy_accuracy": greedy_accuracy(agent, EVAL_PROBLEMS, **kwargs),
        "eval_problems": EVAL_PROBLEMS,
        f"greedy_accuracy_first_{QUICK_PROBLEMS}": greedy_accuracy(agent, QUICK_PROBLEMS, **kwargs),
    }


def _train_into(name: str, preset: WarmStart, out_dir: Path) -> dict[str, Any]:
    """Trains the adapter into ``out_dir`` and measures the merged model; returns the card."""
    start = time.perf_counter()
    base_dir = ensure_embedded(preset.base)
    torch.manual_seed(preset.seed)
    student = _student(preset, base_dir, preset.lora)
    items = embedded_task("train", preset.steps * preset.batch_size, seed=preset.seed, **preset.knobs)
    final_loss = supervised_steps(
        student, solution_pairs(student, items, preset.instruction), preset.steps, lr=preset.lr,
        batch_size=preset.batch_size, weight_decay=0.0,
    )  # fmt: skip
    _save_adapter(student, out_dir)
    train_seconds = time.perf_counter() - start
    return {
        "warm_start": name,
        **{k: v for k, v in dataclasses.asdict(preset).items() if k != "lora"},
        "lora": preset.lora.to_dict(),
        "trainable_parameters": sum(p.numel() for p in student.trainable_parameters()),
        "final_sft_loss": round(final_loss, 4),
        **_measure(name, preset, out_dir),
        "train_seconds": round(train_seconds, 1),
        "build_seconds": round(time.perf_counter() - start, 1),
        "built_on": machine_info(),
    }


def rebuild_warm(name: str, *, ship_it: bool = False) -> dict[str, Any]:
    """Trains a warm start on this machine and compares it with the shipped card (`rebuild_tiny`'s twin).

    Returns:
        ``agent``, ``shipped_accuracy``, ``rebuilt_accuracy``, ``delta``, ``same_weights`` (bit-identical to
        the shipped adapter), ``build_seconds`` and ``path`` of the rebuild.
    """
    preset = warm_preset(name)
    out = cache_root() / "warm-builds" / name
    card: dict[str, Any] = {}

    def fill(scratch: Path) -> None:
        card.update(_train_into(name, preset, scratch))
        atomic_write_json(scratch / DONE_MARKER, card)

    build_once(out, fill, complete=lambda folder: False)  # always a fresh build
    shipped, shipped_path = shipped_card("warm", name), shipped_dir("warm", name)
    same = (
        None
        if shipped_path is None
        else (shipped_path / ADAPTER).read_bytes() == (out / ADAPTER).read_bytes()
    )
    if ship_it:
        ship(out, "warm", name, [ADAPTER], card)
    shipped_acc = None if shipped is None else shipped["initial_greedy_accuracy"]
    acc = card["initial_greedy_accuracy"]
    return {
        "agent": f"warm:{name}",
        "shipped_accuracy": shipped_acc,
        "rebuilt_accuracy": acc,
        "delta": None if shipped_acc is None else round(acc - shipped_acc, 4),
        "same_weights": same,
        "build_seconds": card["build_seconds"],
        "path": str(out),
    }


# The supervised loop (warm starts of the tiny zoo and of the embedded models).

WARMUP_STEPS = 20
"""Linear learning-rate warm-up of every warm start, in steps (then constant)."""


def lr_at(step: int, lr: float) -> float:
    """Linear warm-up over `WARMUP_STEPS` steps, then constant: a warm start stops mid-curve, not annealed.

    The schedule does not depend on the total step count, so a shorter warm start is an exact prefix of a
    longer one with the same seed (``gpt2-char-early`` is a snapshot of ``gpt2-char``'s own trajectory).
    """
    return lr * min(1.0, (step + 1) / WARMUP_STEPS)


def solution_pairs(
    agent: Any, items: list[Any], instruction: str | None
) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, solution ids + EOS)`` of each item in the agent's own prompt format and tokenization."""
    return [
        (
            agent.encode_prompt(build_prompt(item.question, instruction)),
            [*agent.tokenizer.encode(item.solution, add_special_tokens=False), agent.eos_token_id],
        )
        for item in items
    ]


def supervised_steps(
    agent: Any,
    pairs: list[tuple[list[int], list[int]]],
    steps: int,
    *,
    lr: float,
    batch_size: int,
    betas: tuple[float, float] = (0.9, 0.98),
    weight_decay: float = 0.01,
    callback: Callable[[int, Any], None] | None = None,
    callback_every: int = 0,
) -> float:
    """``steps`` AdamW steps on consecutive batches of ``pairs``; loss on response tokens only.

    Trains `Agent.trainable_parameters` (the adapters of a LoRA agent, else every weight). Logits are
    computed only from the first response column on (a 262k-token vocabulary times every prompt position
    would dominate). ``callback(step, agent)`` is called every ``callback_every`` steps (calibration curves).

    Returns:
        The last step's loss (NaN for 0 steps).
    """
    params = agent.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = pack(pairs[step * batch_size : (step + 1) * batch_size], agent.pad_token_id)
        ids_B_T, response_B_T = batch.input_ids_B_T.to(agent.device), batch.response_mask_B_T.to(agent.device)
        keep = ids_B_T.shape[1] - int(response_B_T.any(dim=0).nonzero()[0]) + 1
        # An all-ones mask is exact here (right padding + causal attention: no real token sees a pad, and pads
        # carry no loss) and lets the fused causal attention path run (~10% faster on CPU).
        logits_B_K_V = agent.model(
            input_ids=ids_B_T, attention_mask=torch.ones_like(ids_B_T), logits_to_keep=keep
        ).logits[:, :-1]
        targets_B_K, mask_B_K = ids_B_T[:, -keep + 1 :], response_B_T[:, -keep + 1 :].bool()
        loss = torch.nn.functional.cross_entropy(logits_B_K_V[mask_B_K].float(), targets_B_K[mask_B_K])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if callback is not None and callback_every and (step + 1) % callback_every == 0:
            callback(step + 1, agent)
    return float(loss.detach())


def greedy_accuracy(
    agent: Any,
    n: int = 1000,
    *,
    seed: int = 0,
    instruction: str | None = None,
    knobs: Mapping[str, Any] | None = None,
) -> float:
    """Greedy accuracy on the first ``n`` held-out embedded problems (math-verify grading).

    Args:
        agent: The model, prompted in its own format.
        n: Held-out items (the draw for a smaller n is a prefix of the draw for a larger one).
        seed: Seed of the held-out draw.
        instruction: Appended to each question (`build_prompt`); None = the bare question.
        knobs: Embedded-task knobs (``regime`` and overrides); None = the default regime.
    """
    items = embedded_task("test", n, seed=seed, **dict(knobs or {}))
    prompts = [build_prompt(item.question, instruction) for item in items]
    rollouts = generate(agent, prompts, n=1, temperature=0.0)
    grades = grade_batch([r.text for r in rollouts], [item.answer for item in items])
    return sum(g.reward for g in grades) / len(grades)
