"""The memory and time plan of an experiment: what every agent holds, what each phase adds, the batch sizes.

`plan_experiment` is the one place batch sizes come from: the trainer calls it with what its workers report
after loading (`AgentFacts`), and ``python -m workbench plan CONFIG`` with facts read from each model's
config alone (`facts_from_config`; no weights are loaded). Per device it takes ``train.memory_fraction`` of
the device's memory, subtracts the runtime (`workbench.agents.plan.memory.runtime_bytes`, one per process) and
every agent's resident bytes (weights, adapters, optimizer state, KV reference), and gives each agent the rest
as its transient budget: all of it with ``executor: local`` (agents run one after another), an equal share
with ``executor: threads`` or ``ray`` (agents on one device run at once). Generation and evaluation batches
hold as many rows as that budget allows (`workbench.agents.plan.memory.generation_rows` at run time, with the
real prompt lengths).
An update or scoring micro-batch counts ``train.micro_batch_size`` full-length sequences, fewer when
``train.micro_batch_tokens`` cuts it (`micro_batch_rows`); packed micro-batches (no padding, shared prompts
once: `workbench.agents.forward.packing`) hold fewer tokens than that, so the plan errs on the safe side.

With ``train.engine: vllm`` every agent's rollouts come from its own vLLM server on the agent's device: the
server's weights, KV cache (``train.engine_kv_gib``) and runtime (`workbench.agents.plan.memory.engine_bytes`)
are taken off that device before the budgets are shared out, and the trainer's generation phase is empty.

Times are estimates for CUDA from three device constants (`SPEEDS`): sustained matmul FLOP/s, memory
bandwidth, and the cost of one eager op (kernel launch + Python dispatch); a decode step costs the largest.
None of them is measured on a GPU yet; on CPU the constants are not calibrated and no times are printed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from workbench.agents.models.configs import model_config, prompt_tokens
from workbench.agents.plan.memory import (
    AgentMemory,
    ModelDims,
    agent_memory,
    element_bytes,
    engine_bytes,
    generation_row_bytes,
    rows_within,
    runtime_bytes,
    scoring_bytes,
    trained_kind,
    training_bytes,
)
from workbench.agents.plan.shapes import Inventory, checkpoint_bytes, precision_policy
from workbench.config.agent_spec import AgentSpec
from workbench.config.experiment import ExperimentConfig

__all__ = ["SPEEDS", "AgentFacts", "AgentPlan", "ExperimentPlan", "plan_experiment"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Speed:
    """What a device sustains, for the time estimates."""

    flops: float
    """Matmul FLOP/s actually reached in training and scoring."""
    bandwidth: float
    """Bytes/s of weight and KV reads while decoding."""
    op_seconds: float
    """Seconds per eager op (launch + Python dispatch); CUDA graphs remove most of it."""


SPEEDS = {
    "cpu": Speed(flops=100e9, bandwidth=20e9, op_seconds=10e-6),
    "cuda": Speed(flops=0.4 * 989e12, bandwidth=4.8e12, op_seconds=8e-6),
}
"""CUDA: an H200-class GPU, bf16 at 40% of its 989 TFLOP/s, 4.8 TB/s, ~8 µs per eager op (assumed, not
measured). CPU: 2 cores, fp32 matmuls at 100 GFLOP/s; SmolLM2 decodes far below that (its eager ops and LM
head dominate), so CPU times are not shown."""
OPS_PER_LAYER = 84
"""Eager ops one Qwen3 decoder layer dispatches per decode step without adapters (counted on CPU with a
``TorchDispatchMode``, transformers 5.24); each LoRA-adapted projection adds `OPS_PER_ADAPTER`."""
OPS_PER_ADAPTER = 10
"""Eager ops a LoRA adapter adds to its projection's forward (154 per layer with all 7 adapted)."""


@dataclass(frozen=True)
class AgentFacts:
    """What the plan needs about one agent besides its spec."""

    config: dict[str, Any]
    """Its model's ``config.json``."""
    device: str
    """Where it runs (``cpu``, ``cuda:0``); agents with the same string share memory."""
    device_memory: int
    """Total bytes of that device."""
    prompt_tokens: int
    """The longest prompt expected (the trainer measures a sample of its prompts)."""
    source: str = ""
    """Where the config came from (for the printed plan)."""

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]


@dataclass(frozen=True)
class AgentPlan:
    """One agent's bytes and batch sizes."""

    name: str
    facts: AgentFacts
    dims: ModelDims
    memory: AgentMemory
    budget: int
    """Transient bytes this agent may use (generation, evaluation, update)."""
    rollout_rows: int
    rollout_needed: int
    eval_rows: int
    eval_sampled_rows: int
    phases: dict[str, int]
    """Transient peak of each phase at the chosen sizes: generate, eval, score, update (with its parts)."""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max(self.phases[k] for k in ("generate", "eval", "score", "update"))


@dataclass(frozen=True)
class ExperimentPlan:
    """Every agent's plan and, per device, the budget and the predicted peak."""

    agents: list[AgentPlan]
    devices: dict[str, dict[str, int]]
    warnings: list[str]

    @property
    def budgets(self) -> list[int]:
        """Each agent's transient budget, in agent order (what the trainer hands its workers)."""
        return [a.budget for a in self.agents]


def micro_batch_rows(micro_batch_size: int, micro_batch_tokens: int | None, tokens: int) -> int:
    """Full-length sequences of ``tokens`` tokens a micro-batch holds: ``micro_batch_size``, fewer when
    ``micro_batch_tokens`` cuts it (rounded up; at least one), so a plan sized by it never under-counts."""
    if micro_batch_tokens is None:
        return micro_batch_size
    return max(1, min(micro_batch_size, math.ceil(micro_batch_tokens / max(tokens, 1))))


def _act(spec: AgentSpec, device_type: str) -> int:
    return element_bytes(precision_policy(spec, device_type).activations)


def _phases(
    cfg: ExperimentConfig, spec: AgentSpec, facts: AgentFacts, dims: ModelDims, mem: AgentMemory, budget: int
) -> tuple[dict[str, int], tuple[int, int, int, int]]:
    """Transient bytes of each phase, and the rows (rollout, needed, eval greedy, eval sampled) chosen."""
    t, kind, act = cfg.train, facts.device_type, _act(spec, facts.device_type)
    prompt, new = facts.prompt_tokens, t.max_new_tokens
    eval_new = t.eval_max_new_tokens or new
    needed = t.prompts_per_step * cfg.step_method.group_size
    per_row = generation_row_bytes(dims, act, prompt, new, sampled=True, top_p=t.top_p)
    rollout = rows_within(budget, per_row, needed, kind)
    greedy_row = generation_row_bytes(dims, act, prompt, eval_new, sampled=False)
    sampled_row = generation_row_bytes(dims, act, prompt, eval_new, sampled=True, top_p=spec.top_p)
    eval_items = cfg.task.eval_size
    greedy = rows_within(budget, greedy_row, max(eval_items, 1), kind)
    sampled = rows_within(budget, sampled_row, max(eval_items * t.eval_samples, 1), kind)
    micro, tokens = micro_batch_rows(t.micro_batch_size, t.micro_batch_tokens, prompt + new), prompt + new
    trained = trained_kind(spec, Inventory.from_config(facts.config))
    acts, logits = training_bytes(
        dims, act, micro, tokens, new, checkpointing=spec.gradient_checkpointing, trained=trained
    )
    score = scoring_bytes(dims, act, micro, tokens) + mem.dequantize
    if t.engine == "vllm":  # the agent's server samples: the trainer holds no rollout batch
        rollout, per_row = 0, 0
    phases = {
        "generate": rollout * per_row + mem.dequantize,
        "kv_rollout": rollout * dims.kv_bytes(prompt + new, act),
        "eval": max(greedy * greedy_row, sampled * sampled_row if t.eval_samples else 0) if eval_items else 0,
        "kv_eval": max(greedy, sampled if t.eval_samples else 0) * dims.kv_bytes(prompt + eval_new, act),
        "score": score,
        "activations": acts,
        "logits": logits,
        "update": acts + logits + mem.gradients + mem.dequantize,
    }
    return phases, (rollout, needed, greedy, sampled)


def _seconds(
    cfg: ExperimentConfig, spec: AgentSpec, facts: AgentFacts, inv: Inventory, rows: int, needed: int
) -> dict[str, float]:
    """Per-step time estimates (`SPEEDS`): generation bounded by ops, bandwidth or FLOPs; score and update by
    FLOPs (update: forward, backward and, with LoRA or checkpointing, one recomputation: 6 passes' worth)."""
    t, speed = cfg.train, SPEEDS[facts.device_type]
    dims = ModelDims.from_config(facts.config)
    weights_read = inv.params * (2 if facts.device_type == "cuda" else 4)
    batches = math.ceil(needed / max(rows, 1))  # rows 0: a vLLM server samples (its speed is not estimated)
    adapted = len(inv.matching(spec.lora.target_modules)) / dims.layers if spec.lora else 0
    step = max(
        dims.layers * (OPS_PER_LAYER + OPS_PER_ADAPTER * adapted) * speed.op_seconds,
        weights_read / speed.bandwidth,
        2 * inv.params * rows / speed.flops,
    )
    tokens = needed * (facts.prompt_tokens + t.max_new_tokens)
    return {
        "generate_s": batches * t.max_new_tokens * step if rows else math.nan,
        "decode_tok_s": rows / step if rows else math.nan,
        "score_s": 2 * inv.params * tokens / speed.flops,
        "update_s": 6 * inv.params * tokens * (1 + cfg.step_method.shares_rollouts) / speed.flops,
    }


def plan_experiment(cfg: ExperimentConfig, facts: list[AgentFacts]) -> ExperimentPlan:
    """The plan of ``cfg`` given each agent's facts (module docstring).

    Args:
        cfg: The experiment (agents, ``train`` sizes, ``task.eval_size``, ``executor``).
        facts: One per agent, in agent order.

    Returns:
        Every agent's bytes, budget, batch sizes and phase peaks; per device the totals and the peak; warnings
        for what does not fit (the message names the knob to change).
    """
    fraction = cfg.train.memory_fraction
    parallel = cfg.executor != "local"  # agents run at once
    inventories = [Inventory.from_config(f.config) for f in facts]
    memories = [
        agent_memory(
            spec, inv, f.device_type, kl=cfg.train.kl_coef > 0, checkpoint_bytes=checkpoint_bytes(f.config)
        )
        for spec, inv, f in zip(cfg.agents, inventories, facts)
    ]
    kv_cache = int(cfg.train.engine_kv_gib * 2**30)
    engines = [
        engine_bytes(inv, f.device_type, kv_cache) if cfg.train.engine == "vllm" else 0
        for inv, f in zip(inventories, facts)
    ]
    devices: dict[str, dict[str, int]] = {}
    for f, mem, engine in zip(facts, memories, engines):
        d = devices.setdefault(f.device, {"total": f.device_memory, "agents": 0, "resident": 0, "engine": 0})
        d["agents"] += 1
        d["resident"] += mem.resident
        d["engine"] += engine
    for name, d in devices.items():
        processes = d["agents"] if parallel else 1
        d["usable"] = int(d["total"] * fraction)
        d["runtime"] = runtime_bytes(name.split(":")[0]) * processes
        free = d["usable"] - d["runtime"] - d["resident"] - d["engine"]
        d["budget"] = free // (d["agents"] if parallel else 1)
    plans, warnings = [], []
    for spec, f, inv, mem in zip(cfg.agents, facts, inventories, memories):
        dims, d = ModelDims.from_config(f.config), devices[f.device]
        phases, (rollout, needed, greedy, sampled) = _phases(cfg, spec, f, dims, mem, d["budget"])
        plan = AgentPlan(
            spec.display_name, f, dims, mem, d["budget"], rollout, needed, greedy, sampled, phases,
            _seconds(cfg, spec, f, inv, rollout, needed),
        )  # fmt: skip
        plans.append(plan)
        if d["budget"] <= 0:
            warnings.append(
                f"{f.device}: the agents' resident memory ({_gib(d['resident'])}) and runtime do not fit in "
                f"train.memory_fraction = {fraction} of {_gib(d['total'])}: quantize, use LoRA, or another "
                "device"
            )
        elif phases["update"] > d["budget"]:
            warnings.append(
                f"agent {plan.name!r}: an update micro-batch needs {_gib(phases['update'])} but "
                f"{_gib(d['budget'])} are left: lower train.micro_batch_size = "
                f"{cfg.train.micro_batch_size} (or set train.micro_batch_tokens) or set "
                "gradient_checkpointing: true"
            )
    for name, d in devices.items():
        d["peak"] = (
            d["runtime"]
            + d["resident"]
            + d["engine"]
            + _transient_peak([p for p in plans if p.facts.device == name], parallel)
        )
    return ExperimentPlan(plans, devices, warnings)


def _transient_peak(plans: list[AgentPlan], parallel: bool) -> int:
    """The transient part of a device's peak. CUDA: torch's caching allocator reuses what a phase freed, so
    the largest phase counts. CPU: freed memory stays in the process (glibc keeps it for reuse but the later
    phase needs more), so a step's sampling (generation or evaluation) and its scoring or update add up.
    Agents running at once (Ray) add up."""
    on_cpu = plans[0].facts.device_type == "cpu"
    sampling = [max(p.phases["generate"], p.phases["eval"]) for p in plans]
    training = [max(p.phases["score"], p.phases["update"]) for p in plans]
    if on_cpu:
        return sum(sampling) + sum(training) if parallel else max(sampling) + max(training)
    peaks = [p.peak for p in plans]
    return sum(peaks) if parallel else max(peaks)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def facts_from_config(
    cfg: ExperimentConfig, prompts: list[str], *, device: str | None = None, memory: int | None = None
) -> tuple[list[AgentFacts], list[str]]:
    """Each agent's facts from its config alone (`model_config`), and notes on where they came from.

    Args:
        cfg: The experiment.
        prompts: Sample prompts (user contents) to measure the longest prompt.
        device: ``cuda`` or ``cpu`` for every agent; None = each agent's ``device`` (``auto``: CUDA if any).
        memory: Bytes of each device; None = this machine's (a GPU must then be present for ``cuda``).
    """
    import torch

    from workbench.agents.plan.memory import device_memory

    facts, notes = [], []
    for spec in cfg.agents:
        kind = device or spec.device.split(":")[0]
        if kind == "auto":
            kind = "cuda" if torch.cuda.is_available() else "cpu"
        key = spec.device if kind == "cuda" and spec.device.startswith("cuda:") else f"{kind}:0"
        if memory is None and kind == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda on a machine without CUDA needs --memory (e.g. --memory 80GiB)")
        total = memory or device_memory(torch.device(kind))
        config, where = model_config(spec)
        tokens, how = prompt_tokens(spec, prompts)
        facts.append(AgentFacts(config, "cpu" if kind == "cpu" else key, total, tokens, where))
        notes.append(f"{spec.display_name}: config from {where}; longest prompt {tokens} tokens ({how})")
    return facts, notes


def render(plan: ExperimentPlan, cfg: ExperimentConfig) -> str:
    """The plan as Markdown: one row per agent, one line per device, time estimates, warnings."""
    t = cfg.train
    head = (
        "| agent | device | weights | adapters | optimizer | reference | rollout rows | KV at rollout batch "
        "| eval rows (greedy / sampled) | KV at eval batch | activations / micro-batch "
        "| logits / micro-batch | gradients |"
    )
    lines = [
        f"memory plan of {cfg.experiment!r}: train.memory_fraction {t.memory_fraction}, executor "
        f"{cfg.executor}, micro-batch {t.micro_batch_size} sequences"
        f"{'' if t.micro_batch_tokens is None else f' or {t.micro_batch_tokens} tokens'}, rollout "
        f"{t.max_new_tokens} / eval "
        f"{t.eval_max_new_tokens or t.max_new_tokens} new tokens",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    evaluates = cfg.task.eval_size > 0
    for p in plan.agents:
        m, ph = p.memory, p.phases
        sampled = p.eval_sampled_rows if t.eval_samples else "—"
        eval_rows, kv_eval = (f"{p.eval_rows} / {sampled}", _gib(ph["kv_eval"])) if evaluates else ("—", "—")
        rollout = "vLLM server" if t.engine == "vllm" else f"{p.rollout_rows} of {p.rollout_needed}"
        lines.append(
            f"| {p.name} | {p.facts.device} | {_gib(m.weights)} | {_gib(m.adapters)} | {_gib(m.optimizer)} "
            f"| {_gib(m.reference)} | {rollout} | {_gib(ph['kv_rollout'])} "
            f"| {eval_rows} | {kv_eval} | {_gib(ph['activations'])} | {_gib(ph['logits'])} "
            f"| {_gib(m.gradients)} |"
        )
    lines.append("")
    for name, d in plan.devices.items():
        lines.append(
            f"- {name}: {_gib(d['total'])} x {t.memory_fraction} = {_gib(d['usable'])} usable; runtime "
            f"{_gib(d['runtime'])}, resident {_gib(d['resident'])}"
            + (f", vLLM servers {_gib(d['engine'])}" if d["engine"] else "")
            + ", transient budget per agent "
            f"{_gib(d['budget'])}; predicted peak {_gib(d['peak'])}"
        )
    for p in plan.agents:
        phases = ", ".join(f"{k} {_gib(p.phases[k])}" for k in ("generate", "eval", "score", "update"))
        s, times = p.seconds, ""
        if p.facts.device_type == "cuda":  # the CPU constants are not calibrated: no CPU times are printed
            generate = (
                "by its vLLM server (not estimated)"
                if t.engine == "vllm"
                else f"{s['generate_s']:.1f} s ({s['decode_tok_s']:.0f} tok/s)"
            )
            times = (
                f"; time per step (estimate, `SPEEDS`) generate {generate}, score {s['score_s']:.1f} s, "
                f"update {s['update_s']:.1f} s"
            )
        lines.append(f"- {p.name}: transient peaks {phases}{times}")
    lines += [f"- WARNING: {w}" for w in plan.warnings]
    return "\n".join(lines)
