"""The GPU recipes (``experiments/gpu/*.yaml``) pass their own ``--dry-run``: with local data files, or with
the ``data`` extra (``datasets``) and a hub; without either, the error names the extra and its install."""

import logging
import socket
import sys
import types
from pathlib import Path

import pytest

from workbench.__main__ import main
from workbench.config.loading import load_experiment
from workbench.tasks.loaders import DATASETS_REQUIREMENT

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "experiments" / "gpu").glob("*.yaml"))
DATA = ROOT / "tests" / "data"


@pytest.fixture
def dry_run(caplog, monkeypatch):
    """``run RECIPE --dry-run`` where a hub may be (HF_HUB_OFFLINE unset: hub ids are taken as loadable)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HACPO_DATA_DIR", raising=False)
    caplog.set_level(logging.INFO)

    def call(recipe: str) -> tuple[int, str]:
        caplog.clear()
        return main(["run", recipe, "--dry-run"]), "\n".join(caplog.messages)

    return call


def test_the_recipes_are_the_three_pairs_and_switch_qwen3_thinking_off():
    assert len(RECIPES) == 3
    for recipe in RECIPES:
        for agent in load_experiment(ROOT / recipe).agents:
            if agent.model.startswith("Qwen/Qwen3"):
                assert dict(agent.chat_template_kwargs) == {"enable_thinking": False}, (recipe, agent.name)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_passes_its_dry_run_with_local_data_files(recipe, dry_run, monkeypatch):
    monkeypatch.setenv("HACPO_DATA_DIR", str(DATA))
    code, out = dry_run(recipe)
    assert code == 0, out
    assert "# checked: no bad input" in out


@pytest.mark.parametrize("recipe", RECIPES)
def test_without_data_files_or_datasets_the_error_names_the_data_extra(recipe, dry_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    code, out = dry_run(recipe)
    assert code == 2
    assert "pip install -e '.[data]'" in out and DATASETS_REQUIREMENT in out


def test_with_the_data_extra_and_a_hub_a_recipe_loads_through_datasets(dry_run, monkeypatch):
    loaded = []

    def load_dataset(hub_id, config=None, split="train"):
        loaded.append((hub_id, split))
        return [{"problem": f"What is {i} + 1 ({hub_id})?", "answer": str(i + 1)} for i in range(600)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(
        socket, "create_connection", lambda *a, **k: types.SimpleNamespace(close=lambda: None)
    )
    code, out = dry_run(RECIPES[0])
    assert code == 0, out
    assert {hub for hub, _ in loaded} == {"DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"}
