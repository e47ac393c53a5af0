"""Coming from TRL: where each `GRPOConfig` setting lives here, and the "did you mean" of an unknown key.

`TRL_NAMES` is the one table: a TRL (or peft, transformers ``TrainingArguments``) name, the workbench key that
does the same (empty when nothing does), and a note. `suggestion` reads it, and ``difflib`` for near names, so
that an unknown key in any section names the key meant; ``docs/config.md`` renders it as its "Coming from
TRL" table (`workbench.config.reference`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

__all__ = ["TRL_NAMES", "suggestion"]

TRL_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("train.lr", "or `agents[i].lr` for one agent"),
    "lr_scheduler_type": (
        "train.lr_schedule",
        "`constant`, `linear` or `cosine`, stepped once per training step",
    ),
    "warmup_steps": ("train.warmup_steps", "in training steps"),
    "warmup_ratio": ("train.warmup_ratio", "of `train.steps`"),
    "num_generations": ("train.group_size", "G, responses per agent per prompt"),
    "max_completion_length": ("train.max_new_tokens", ""),
    "max_steps": ("train.steps", ""),
    "num_train_epochs": ("train.steps", "steps cycle through `task.train_size` problems"),
    "per_device_train_batch_size": ("train.prompts_per_step", "prompts, not completions: G each"),
    "generation_batch_size": ("train.prompts_per_step", "prompts per step"),
    "steps_per_generation": ("train.minibatch_prompts", "optimizer steps per step = prompts / mini-batch"),
    "gradient_accumulation_steps": ("train.micro_batch_size", "micro-batches are cut to this size"),
    "max_grad_norm": ("train.grad_clip", ""),
    "beta": ("train.kl_coef", "low_var_kl on the learner's own samples"),
    "epsilon": ("hacpo.eps_low", "GSPO's sequence-level clip"),
    "epsilon_high": ("hacpo.eps_high", ""),
    "mask_truncated_completions": ("train.mask_truncated", ""),
    "scale_rewards": ("hacpo.normalize_by_std", "true = divide by the group's std"),
    "importance_sampling_level": ("algorithm", "`gspo` is sequence-level, `grpo` token-level"),
    "loss_type": ("algorithm", "losses are seq-mean-token-mean (`docs/hacpo.md`)"),
    "reward_funcs": ("task.rewards", "a list of `{fn, weight}`"),
    "reward_weights": ("task.rewards", "each entry's `weight`"),
    "generation_kwargs": ("agents[i].top_k", "and `min_p`, `repetition_penalty`, `stop_strings` per agent"),
    "top_k": ("agents[i].top_k", ""),
    "min_p": ("agents[i].min_p", ""),
    "repetition_penalty": ("agents[i].repetition_penalty", ""),
    "stop": ("agents[i].stop_strings", "vLLM's name"),
    "lora_alpha": ("agents[i].lora.alpha", "peft's name"),
    "lora_dropout": ("agents[i].lora.dropout", "peft's name"),
    "lora_r": ("agents[i].lora.r", ""),
    "lora_target_modules": ("agents[i].lora.target_modules", ""),
    "model_name_or_path": ("agents[i].model", ""),
    "gradient_checkpointing": ("agents[i].gradient_checkpointing", ""),
    "output_dir": ("output.root", ""),
    "report_to": ("output.report_to", ""),
    "save_steps": ("train.save_every", ""),
    "save_total_limit": ("train.keep_checkpoints", ""),
    "eval_steps": ("train.eval_every", ""),
    "dataset_name": ("task.source", ""),
    "num_iterations": ("", "one update pass over each step's batch (μ = 1)"),
    "use_vllm": ("train.engine", "`vllm`: a server per agent, weights reloaded each step (`docs/engine.md`)"),
    "logging_steps": ("", "every step is logged"),
}
"""TRL name -> (workbench key, note); an empty key: nothing here does the same (the note says why)."""


def suggestion(name: str, valid: Sequence[str], section: str = "") -> str:
    """ "did you mean ..." for an unknown key ``name`` of ``section`` (its ``valid`` keys), or "".

    A TRL name points at its workbench key (or says that nothing does); otherwise the nearest valid key of
    the section, when one is close (``difflib``, cutoff 0.75).
    """
    if name in TRL_NAMES:
        target, note = TRL_NAMES[name]
        if not target:
            return f"TRL's {name} has no counterpart here: {note}"
        return f"did you mean {target} (TRL's {name}{': ' + note if note else ''})?"
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.75)
    if close:
        return f"did you mean {section + '.' if section else ''}{close[0]}?"
    return ""
