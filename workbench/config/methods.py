"""The one table of methods: every algorithm, baseline and ablation, its mechanics, switches and looks.

Baselines and ablations are configurations, never forked code. A *method* is what a
table row or a figure line shows: an ``algorithm`` (how the shared machinery runs) plus, for an ablation,
the switches of the ``hacpo`` section that define it. An experiment names its method with ``label`` (empty:
the algorithm); config validation checks that a known label agrees with its switches, and tables, figures
and reports take the display label, colour and order from here (dict order is display order).

| method | label | algorithm | switches of the ``hacpo`` section | paper |
|---|---|---|---|---|
| ``grpo`` | GRPO | itself (token-level loss, ε 0.2 / 0.28) | | Table 1 |
| ``gspo`` | GSPO | itself (each agent alone) | | Table 1 |
| ``gspo_x2`` | GSPO×2 | itself (2G rollouts per prompt) | | Table 1 |
| ``naive`` | Naive | itself (shares, ω ≡ 1, GSPO on every sample) | | Table 1 |
| ``naive-sym`` | Naive (sym.) | naive | ``naive_symmetric: true`` | (beyond the paper) |
| ``hacpo-adv`` | HACPO − Adv | hacpo | ``capability_baseline: false`` | Table 2 |
| ``hacpo-omega`` | HACPO − ω | hacpo | ``omega_in_loss: false`` | Table 3 |
| ``hacpo-alpha0`` | HACPO α = 0 | hacpo | ``alpha: 0`` | Table 4 |
| ``hacpo-alpha2`` | HACPO α = 2 | hacpo | ``alpha: 2`` | Table 4 |
| ``hacpo-alpha3`` | HACPO α = 3 | hacpo | ``alpha: 3`` | Table 4 |
| ``hacpo-nostepwise`` | no Stepwise | hacpo | ``delta_step: 0`` | Figure 4 |
| ``hacpo-noclip`` | no Clip | hacpo | ``clip_cross: false`` | Figure 4 |
| ``hacpo-bytes`` | HACPO (bytes) | hacpo | ``ratio_normalization: bytes`` | (beyond the paper) |
| ``hacpo-owngroup`` | HACPO (own Eq. 5) | hacpo | ``own_advantage: group`` | (beyond the paper) |
| ``hacpo-mixed`` | HACPO (mixed) | hacpo | ``batch_order: by_prompt`` | (the authors' main branch) |
| ``hacpo`` | HACPO | itself (shares, capability-aware advantages, HACPO loss) | | Table 1 |

A name not in the table (a user's own ``label``) is shown as it is, in a spare colour, after the known
methods and before HACPO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.config.checks import FrozenMap
from workbench.config.sections import HacpoConfig, TrainConfig

__all__ = [
    "ALGORITHMS",
    "METHODS",
    "SPARE_COLORS",
    "Method",
    "StepMethod",
    "method_colors",
    "method_label",
    "method_sort_key",
    "methods_in",
]


NO_SWITCHES = FrozenMap()
"""The switches of a method that is an algorithm: none."""


@dataclass(frozen=True)
class Method:
    """One method: how it runs (an ``algorithm``'s mechanics plus ``switches``) and how it is shown."""

    name: str
    """Key of :data:`METHODS`: an experiment's ``algorithm``, or the ``label`` of an ablation."""
    label: str
    """Display label in tables and legends (the paper's name)."""
    color: str
    """Its colour in every figure."""
    share_rollouts: bool
    """Learners train on every agent's rollouts (True) or only their own."""
    loss: str
    """Policy loss name in ``workbench.core.losses.POLICY_LOSSES``."""
    capability_advantages: bool
    """Use the capability-aware baseline (ω ≠ 1 possible); False uses the plain joint/group mean."""
    omega_coef: bool = False
    """Scale a cross sample's loss by its loss coefficient ω^(source, learner) (Eq. 10); the ``hacpo``
    switch ``omega_in_loss: false`` turns it off (the −ω ablation). False: every sample counts once."""
    group_multiplier: int = 1
    """Rollouts per prompt = group_multiplier · G (2 for GSPO×2)."""
    clip: tuple[float, float] | None = None
    """Override of the self-sample clip (ε_low, ε_high); None keeps the ``hacpo`` section's."""
    algorithm: str = ""
    """The ``algorithm`` an experiment of this method sets; empty = ``name`` (the method is an algorithm)."""
    switches: FrozenMap = NO_SWITCHES
    """``hacpo`` section values that define an ablation (``{"capability_baseline": False}``)."""
    paper: str = ""
    """Where the paper reports it (``"Table 2"``, ``"Figure 4"``)."""

    def __post_init__(self) -> None:
        if not self.algorithm:
            object.__setattr__(self, "algorithm", self.name)
        object.__setattr__(self, "switches", FrozenMap(self.switches))

    @property
    def is_algorithm(self) -> bool:
        """True for an algorithm (``hacpo``, ``gspo``...), False for an ablation of one."""
        return self.algorithm == self.name


def _ablation(base: Method, name: str, label: str, color: str, paper: str, **switches: Any) -> Method:
    """An ablation of ``base``: the same mechanics, other switches of the ``hacpo`` section."""
    return dataclasses.replace(
        base,
        name=name,
        label=label,
        color=color,
        algorithm=base.name,
        switches=FrozenMap(switches),
        paper=paper,
    )


_NAIVE = Method(
    "naive", "Naive", "#000000", share_rollouts=True, loss="gspo", capability_advantages=False,
    paper="Table 1",
)  # fmt: skip
_HACPO = Method(
    "hacpo",
    "HACPO",
    "#D55E00",
    share_rollouts=True,
    loss="hacpo",
    capability_advantages=True,
    omega_coef=True,
    paper="Table 1",
)

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "grpo", "GRPO", "#009E73", share_rollouts=False, loss="grpo", capability_advantages=False,
            clip=(0.2, 0.28), paper="Table 1",
        ),
        Method(
            "gspo", "GSPO", "#0072B2", share_rollouts=False, loss="gspo", capability_advantages=False,
            paper="Table 1",
        ),
        Method(
            "gspo_x2", "GSPO×2", "#56B4E9", share_rollouts=False, loss="gspo", capability_advantages=False,
            group_multiplier=2, paper="Table 1",
        ),
        _NAIVE,
        _ablation(_NAIVE, "naive-sym", "Naive (sym.)", "#555555", "", naive_symmetric=True),
        _ablation(_HACPO, "hacpo-adv", "HACPO − Adv", "#CC79A7", "Table 2", capability_baseline=False),
        _ablation(_HACPO, "hacpo-omega", "HACPO − ω", "#E69F00", "Table 3", omega_in_loss=False),
        _ablation(_HACPO, "hacpo-alpha0", "HACPO α = 0", "#999933", "Table 4", alpha=0.0),
        _ablation(_HACPO, "hacpo-alpha2", "HACPO α = 2", "#AA4499", "Table 4", alpha=2.0),
        _ablation(_HACPO, "hacpo-alpha3", "HACPO α = 3", "#332288", "Table 4", alpha=3.0),
        _ablation(_HACPO, "hacpo-nostepwise", "no Stepwise", "#882255", "Figure 4", delta_step=0.0),
        _ablation(_HACPO, "hacpo-noclip", "no Clip", "#44AA99", "Figure 4", clip_cross=False),
        _ablation(_HACPO, "hacpo-bytes", "HACPO (bytes)", "#EE7733", "", ratio_normalization="bytes"),
        _ablation(_HACPO, "hacpo-owngroup", "HACPO (own Eq. 5)", "#EE3377", "", own_advantage="group"),
        _ablation(_HACPO, "hacpo-mixed", "HACPO (mixed)", "#997700", "", batch_order="by_prompt"),
        _HACPO,
    )
}  # fmt: skip
"""Every known method by name, in display order (the paper's Table 1 order, ablations before HACPO)."""

ALGORITHMS: dict[str, Method] = {name: m for name, m in METHODS.items() if m.is_algorithm}
"""The valid values of an experiment's ``algorithm``: the methods that are algorithms."""

SPARE_COLORS = ("#F0E442", "#888888", "#117733", "#DDCC77", "#88CCEE", "#661100")
"""Colours of names not in :data:`METHODS`, in order of appearance (none is a known method's colour)."""


def method_label(name: str) -> str:
    """Display label of a method: ``"gspo_x2"`` → ``"GSPO×2"``; a name not in the table as it is."""
    method = METHODS.get(name)
    return method.label if method is not None else name


def method_sort_key(name: str) -> tuple[float, str]:
    """Sort key in display order: the table's order, names not in it after the ablations, before HACPO."""
    order = list(METHODS)
    if name in METHODS:
        return (order.index(name), "")
    return (order.index("hacpo") - 0.5, name)


def method_colors(names: Sequence[str]) -> list[str]:
    """One colour per name: a known method's own, else the next of :data:`SPARE_COLORS` (cycling)."""
    unknown = list(dict.fromkeys(n for n in names if n not in METHODS))
    return [
        METHODS[n].color if n in METHODS else SPARE_COLORS[unknown.index(n) % len(SPARE_COLORS)]
        for n in names
    ]


def methods_in(paper: str) -> list[str]:
    """Names of the methods the paper reports in ``paper`` (``"Table 4"``), in display order."""
    return [name for name, m in METHODS.items() if m.paper == paper]


@dataclass(frozen=True)
class StepMethod:
    """Everything a training step needs to know about its method, resolved once from the method's row of
    :data:`ALGORITHMS` and the config (`resolve_step_method`; ``ExperimentConfig.step_method``): the step
    reads it and decides nothing itself."""

    shares_rollouts: bool
    """Learners train on every agent's rollouts (Sec. 3.3), or each on its own."""
    group_size: int
    """Responses per prompt and agent: G times the method's multiplier (2G for GSPO×2)."""
    baseline_omega: bool
    """Weight source a's rewards by ω^(learner, a) in each learner's baseline (Eq. 7); False: the plain mean
    of the joint group when sharing (− Adv, Naive), of the own group otherwise."""
    own_advantage: str
    """Advantage of a learner's own rows when sharing: ``joint`` (Eq. 6) or ``group`` (Eq. 5)."""
    loss: str
    """Policy loss name in ``workbench.core.losses.POLICY_LOSSES``."""
    loss_omega: bool
    """Scale a shared row's loss term by ω^(source, learner) (Eq. 10); False: 1 (− ω, Naive)."""
    eps_low: float
    """Self-sample clip ε_low (the method's own, GRPO's 0.2, or ``hacpo.eps_low``)."""
    eps_high: float
    """Self-sample clip ε_high."""
    shared_old_policy: str
    """Whose old log-likelihood a shared row's ratio divides by: ``source`` (Eq. 11) or ``learner`` (its
    own at the start of the step: the symmetric Naive)."""
    batch_order: str
    """Order of a learner's rows over its mini-batches: ``own_first`` or ``by_prompt``."""
    ratio_normalization: str
    """Length a shared row's log-likelihoods are divided by: each side's ``tokens`` (Eq. 25) or ``bytes``."""


def resolve_step_method(algorithm: str, train: TrainConfig, hacpo: HacpoConfig) -> StepMethod:
    """The `StepMethod` of an ``algorithm`` under a config's ``train`` and ``hacpo`` sections."""
    method = ALGORITHMS[algorithm]
    eps_low, eps_high = method.clip or (hacpo.eps_low, hacpo.eps_high)
    return StepMethod(
        shares_rollouts=method.share_rollouts,
        group_size=train.group_size * method.group_multiplier,
        baseline_omega=method.capability_advantages and hacpo.capability_baseline,
        own_advantage=hacpo.own_advantage,
        loss=method.loss,
        loss_omega=method.omega_coef and hacpo.omega_in_loss,
        eps_low=eps_low,
        eps_high=eps_high,
        shared_old_policy="learner" if hacpo.naive_symmetric else "source",
        batch_order=hacpo.batch_order,
        ratio_normalization=hacpo.ratio_normalization,
    )
