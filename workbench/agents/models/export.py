"""Export trained agents in the Hugging Face format: ``python -m workbench export RUN_DIR``.

Each agent of a run (its newest intact checkpoint, loaded by `workbench.agents.models.loading.load_agent`) is
written with ``save_pretrained``, tokenizer included, under ``<out>/<agent>/``:

| folder | when | loads with |
|---|---|---|
| ``model/`` | full fine-tuning (tiny agents) | ``load_agent(".../model")``, ``AutoModelForCausalLM`` |
| ``adapter/`` | LoRA: the adapters (``adapter_config.json`` names the base) | ``PeftModel.from_pretrained`` |
| ``merged/`` | LoRA, ``merged=True``: adapters folded into full-precision weights | like ``model/`` |

A quantized (4/8-bit) agent is merged into an unquantized copy of its base (the usual QLoRA export).
``<out>/<agent>/export.json`` records the run, the step and the agent's spec.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from workbench.agents.forward.agent import Agent
from workbench.agents.models.loading import checkpoint_step, load_agent, run_agents
from workbench.core.io import atomic_write_json

__all__ = ["export_agent", "export_run"]

log = logging.getLogger(__name__)


def export_agent(agent: Agent, out_dir: str | Path, *, merged: bool = False) -> list[Path]:
    """Write ``agent`` with ``save_pretrained`` (and its tokenizer) into ``out_dir``.

    Args:
        agent: A loaded agent (e.g. ``load_agent(run_dir, agent=name)``).
        out_dir: The agent's export folder; ``model/``, ``adapter/`` and ``merged/`` go inside.
        merged: With LoRA, also fold the adapters into the base weights (``merged/``). The agent's model is
            merged in place: load it again to keep training it.

    Returns:
        The folders written.
    """
    out_dir = Path(out_dir)
    written = []
    if not agent.is_lora:
        written.append(_save(agent.model, agent, out_dir / "model"))
        return written
    written.append(_save(agent.model, agent, out_dir / "adapter"))
    if merged:
        written.append(_save(agent.model.merge_and_unload(), agent, out_dir / "merged"))
    return written


def _save(model: object, agent: Agent, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    agent.tokenizer.save_pretrained(str(path))
    log.info("wrote %s", path)
    return path


def export_run(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    agents: Sequence[str] | None = None,
    merged: bool = False,
) -> dict[str, list[Path]]:
    """Export every agent of a run (or those named) from its newest intact checkpoint.

    Args:
        run_dir: A run directory ``results/<experiment>/<run-id>``.
        out_dir: Where ``<agent>/`` folders go (default ``<run_dir>/export``).
        agents: Agent names (default all).
        merged: Also write merged weights for LoRA agents (loaded without quantization for that).

    Returns:
        ``{agent: [folders written]}``.

    Raises:
        AgentLoadError: An unknown agent name or no intact checkpoint (the message names them).
    """
    run_dir = Path(run_dir).expanduser()
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "export"
    specs = {spec.name: spec for spec in run_agents(run_dir)}
    written = {}
    for name in agents or list(specs):
        quantized = specs.get(name) is not None and specs[name].quantization != "none"
        changes = {"quantization": "none", "device": "cpu"} if merged and quantized else {}
        agent = load_agent(run_dir, agent=name, **changes)
        written[name] = export_agent(agent, out_dir / name, merged=merged)
        record = {
            "run_dir": str(run_dir.resolve()),
            "agent": name,
            "step": checkpoint_step(run_dir, name),
            "spec": agent.spec.to_dict(),
            "folders": [p.name for p in written[name]],
        }
        atomic_write_json(out_dir / name / "export.json", record)
    return written
