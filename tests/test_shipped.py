"""Shipped agents (zoo/): the manifest matches the files, loading uses them, they reproduce their cards."""

from __future__ import annotations

import shutil

import pytest

from workbench.agents.models.shipped import (
    MANIFEST,
    ZOO_ROOT,
    ShippedError,
    manifest,
    shipped_card,
    shipped_dir,
)
from workbench.agents.models.zoo import TINY_PRESETS, greedy_accuracy

CARD_KEYS = {"initial_greedy_accuracy", "eval_problems", "build_seconds", "built_on"}
KIND_CARD_KEYS = {
    "tiny": {"warm_steps", "parameters"},
    "warm": {"base", "steps", "lr", "trainable_parameters", "lora"},
}


def test_manifest_lists_every_tiny_preset_and_matches_its_files():
    agents = manifest()
    assert {f"tiny/{name}" for name in TINY_PRESETS} <= set(agents)
    for key, entry in agents.items():
        kind, name = key.split("/")
        folder = shipped_dir(kind, name)  # raises on any size or sha256 mismatch
        assert folder == ZOO_ROOT / kind / name
        assert sorted(p.name for p in folder.iterdir()) == sorted(entry["files"]), key
        assert set(entry["card"]) >= CARD_KEYS | KIND_CARD_KEYS[kind], key
        assert {"model", "simd"} <= set(entry["card"]["built_on"]["cpu"])


def test_a_changed_or_truncated_file_is_named(tmp_path):
    root = tmp_path / "zoo"
    shutil.copytree(ZOO_ROOT, root)
    weights = root / "tiny" / "gpt2-char" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedError, match=r"model\.safetensors does not match its sha256"):
        shipped_dir("tiny", "gpt2-char", root=root)
    weights.write_bytes(bytes(data[:100]))
    with pytest.raises(ShippedError, match=r"is 100 bytes, the manifest says"):
        shipped_dir("tiny", "gpt2-char", root=root)
    assert shipped_dir("tiny", "no-such-agent", root=root) is None
    assert (root / MANIFEST.name).is_file()


def test_tiny_preset_loads_the_shipped_weights_unless_warm_steps_are_overridden(monkeypatch):
    from workbench.agents.models.loading import resolve_model_source

    monkeypatch.delenv("HACPO_TINY_WARM_STEPS", raising=False)
    assert resolve_model_source("tiny:llama-bpe") == str(ZOO_ROOT / "tiny" / "llama-bpe")
    monkeypatch.setenv("HACPO_TINY_WARM_STEPS", "3")
    assert "zoo" not in resolve_model_source("tiny:llama-bpe")


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(TINY_PRESETS))
def test_shipped_preset_reproduces_its_card(preset, monkeypatch):
    """Greedy accuracy on the card's 1,000 held-out items, measured here, equals the card's.

    Greedy decoding of the same weights can flip a near-tie between CPUs whose kernels round differently, so
    a difference of up to 5 items (0.005) is allowed; on the machine that built them it is 0.
    """
    from workbench.agents.models.loading import load_agent

    monkeypatch.delenv("HACPO_TINY_WARM_STEPS", raising=False)
    card = shipped_card("tiny", preset)
    agent = load_agent(f"tiny:{preset}")
    measured = greedy_accuracy(agent, card["eval_problems"])
    assert measured == pytest.approx(card["initial_greedy_accuracy"], abs=0.005), (preset, measured)


def test_warm_starts_stop_mid_curve():
    """Each shipped warm start's greedy accuracy on 1,000 held-out items lies in [0.30, 0.60]: RL has headroom
    and a signal (mixed rewards in most groups)."""
    from workbench.agents.models.warm import WARM_STARTS

    for name in WARM_STARTS:
        card = shipped_card("warm", name)
        if card is None:
            continue
        assert card["eval_problems"] == 1000 and 0.30 <= card["initial_greedy_accuracy"] <= 0.60, name
        assert card["steps"] == WARM_STARTS[name].steps and card["train_seconds"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-addsub2", "gemma3-addsub2"])
def test_shipped_warm_start_reproduces_its_card(name):
    """The merged warm start answers the first 100 held-out items as its card says (≤ 2 items apart)."""
    from workbench.agents.models.loading import load_agent
    from workbench.agents.models.warm import WARM_STARTS
    from workbench.config.agent_spec import AgentSpec

    card = shipped_card("warm", name)
    if card is None:
        pytest.skip(f"warm:{name} is not shipped in this checkout")
    preset = WARM_STARTS[name]
    agent = load_agent(AgentSpec(model=f"warm:{name}", **preset.agent_fields()))
    measured = greedy_accuracy(agent, 100, instruction=preset.instruction, knobs=preset.knobs)
    assert measured == pytest.approx(card["greedy_accuracy_first_100"], abs=0.02), (name, measured)
