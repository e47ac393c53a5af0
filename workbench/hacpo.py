"""The HACPO math in one import: capability, advantages and policy losses as pure torch functions.

``import workbench.hacpo`` imports torch only (no transformers, peft, bitsandbytes, altair, ipywidgets or
papermill); ``tests/test_import_boundaries.py`` checks it. Every name below is documented with its equation
number in the paper (arXiv 2603.02604); ``docs/hacpo.md`` states the method in full.
"""

from workbench.core.advantages import (
    CapabilityTracker,
    capability_aware_advantages,
    capability_ratios,
    group_advantages,
)
from workbench.core.losses import (
    POLICY_LOSSES,
    LossParams,
    PolicyBatch,
    SampleStats,
    cross_sample_weight,
    get_policy_loss,
    grpo_policy_loss,
    gspo_policy_loss,
    hacpo_policy_loss,
    low_var_kl,
    masked_mean_logp,
    sequence_ratio,
    stepwise_lower_bound,
)

__all__ = [
    "POLICY_LOSSES",
    "CapabilityTracker",
    "LossParams",
    "PolicyBatch",
    "SampleStats",
    "capability_aware_advantages",
    "capability_ratios",
    "cross_sample_weight",
    "get_policy_loss",
    "group_advantages",
    "grpo_policy_loss",
    "gspo_policy_loss",
    "hacpo_policy_loss",
    "low_var_kl",
    "masked_mean_logp",
    "sequence_ratio",
    "stepwise_lower_bound",
]
