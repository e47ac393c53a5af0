"""The one table of methods: mechanics that exist, ablation YAMLs that match, labels, colours and order."""

from pathlib import Path

import pytest
import yaml

from workbench.config.loading import load_experiment
from workbench.config.methods import (
    ALGORITHMS,
    METHODS,
    SPARE_COLORS,
    method_colors,
    method_label,
    method_sort_key,
    methods_in,
)
from workbench.core.losses import POLICY_LOSSES

ROOT = Path(__file__).resolve().parents[1]
ABLATION_YAMLS = sorted((ROOT / "experiments" / "ablations").glob("*.yaml"))


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_runs_on_existing_machinery(name):
    method = METHODS[name]
    assert method.name == name
    assert method.loss in POLICY_LOSSES, f"{name}: loss {method.loss!r} not in {list(POLICY_LOSSES)}"
    assert method.algorithm in ALGORITHMS
    base = ALGORITHMS[method.algorithm]
    # An ablation is its algorithm plus switches: identical mechanics, never forked code.
    mechanics = ("share_rollouts", "loss", "capability_advantages", "omega_coef", "group_multiplier", "clip")
    assert [getattr(method, k) for k in mechanics] == [getattr(base, k) for k in mechanics]
    assert bool(method.switches) == (not method.is_algorithm)


def test_algorithms_are_the_methods_without_switches():
    assert list(ALGORITHMS) == ["grpo", "gspo", "gspo_x2", "naive", "hacpo"]
    assert ALGORITHMS["grpo"].clip == (0.2, 0.28) and ALGORITHMS["gspo_x2"].group_multiplier == 2
    assert ALGORITHMS["naive"].share_rollouts and not ALGORITHMS["naive"].capability_advantages
    assert methods_in("Table 4") == ["hacpo-alpha0", "hacpo-alpha2", "hacpo-alpha3"]
    assert {m.switches["alpha"] for m in map(METHODS.get, methods_in("Table 4"))} == {0.0, 2.0, 3.0}


@pytest.mark.parametrize("path", ABLATION_YAMLS, ids=lambda p: p.name)
def test_each_ablation_yaml_is_its_method(path):
    cfg = load_experiment(path)
    method = METHODS[cfg.method]
    assert path.stem == method.name and cfg.algorithm == method.algorithm
    # The file switches exactly the method's switches (everything else comes from its base).
    raw = yaml.safe_load(path.read_text())
    assert raw.get("hacpo", {}) == dict(method.switches)
    assert {k: getattr(cfg.hacpo, k) for k in method.switches} == dict(method.switches)


def test_every_ablation_has_a_yaml():
    ablations = sorted(name for name, m in METHODS.items() if not m.is_algorithm)
    assert sorted(p.stem for p in ABLATION_YAMLS) == ablations


def test_labels_order_and_colours():
    assert [method_label(m) for m in ["gspo_x2", "naive", "hacpo", "hacpo-adv", "hacpo-nostepwise"]] == [
        "GSPO×2",
        "Naive",
        "HACPO",
        "HACPO − Adv",
        "no Stepwise",
    ]
    assert method_label("my-variant") == "my-variant"  # a user's own label is shown as it is
    names = ["hacpo", "zeta", "hacpo-noclip", "alpha-x", "gspo", "grpo"]
    assert sorted(names, key=method_sort_key) == ["grpo", "gspo", "hacpo-noclip", "alpha-x", "zeta", "hacpo"]
    colours = [m.color for m in METHODS.values()]
    assert len(set(colours)) == len(colours) and not set(colours) & set(SPARE_COLORS)
    assert method_colors(["hacpo", "mine", "gspo", "other", "mine"]) == [
        METHODS["hacpo"].color,
        SPARE_COLORS[0],
        METHODS["gspo"].color,
        SPARE_COLORS[1],
        SPARE_COLORS[0],
    ]
