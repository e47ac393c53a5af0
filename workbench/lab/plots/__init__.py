"""Altair charts of runs (Figures 3-4 style and the training diagnostics) and their export.

Every chart function takes the WIDE frame of ``workbench.lab.frames.load_runs`` (or ``explore.metrics_frame``)
or the LONG frame of ``melt_metric`` for its key family, and returns a finished chart in the house style:

| function | keys | figure |
|---|---|---|
| :func:`training_curves` | ``eval/acc``, ``train/acc`` | accuracy per agent and method (Fig. 3) |
| :func:`ablation_curves` | ``eval/acc`` | HACPO and its ablations (Fig. 4) |
| :func:`capability_chart` | ``capability`` | windowed accuracy P̂ per agent (Eq. 9) |
| :func:`omega_chart` | ``omega`` | ω = P̂_learner / P̂_source (Eq. 8) |
| :func:`ratio_chart` | ``is/*/*/ratio_*`` | self vs cross sequence ratio s, mean with a min-max band |
| :func:`clip_fraction_chart` | ``is/*/*/clip_frac``, ``in_range_frac`` | clipped / in-range fractions |
| :func:`cross_weight_chart` | ``explore.cross_weight_table`` | a cross sample's weight against s |
| :func:`cost_chart` | ``cost`` | rollouts generated vs trained per agent |
| :func:`diagnostics_chart` | ``workbench.lab.diagnostics.signals_frame`` | per-source signals of each run |
| :func:`verdict_chart` | ``verdicts.csv`` | every claim's Δ with its 95% interval (ablations against HACPO) |
| :func:`regime_chart` | ``workbench.lab.regime.regime_table`` | HACPO − GSPO against the samples behind P̂ |

Runs of one method (seeds) are averaged: each curve is their mean per step with a ±std band (a single line
for one run).

The modules: ``charts`` (Figures 3-4 and the training diagnostics), ``studies`` (the figures of studies:
`diagnostics_chart`, `verdict_chart`, `regime_chart`), ``style`` (:data:`THEME`, :data:`PALETTE`,
:data:`DASHES`, :data:`SHAPES`; methods keep the colour and order of ``workbench.config.methods``), ``export``
(:func:`save_chart` writes PNG, SVG and self-contained HTML atomically). :func:`setup_notebook` selects the
offline ``svg`` renderer (JupyterLab 4's own renderer does not know Vega-Lite v6). altair is imported in this
package and nowhere else.
"""

from workbench.lab.plots.charts import (
    ablation_curves,
    capability_chart,
    clip_fraction_chart,
    cost_chart,
    cross_weight_chart,
    omega_chart,
    ratio_chart,
    training_curves,
)
from workbench.lab.plots.export import chart_to_svg, save_chart
from workbench.lab.plots.studies import diagnostics_chart, regime_chart, verdict_chart
from workbench.lab.plots.style import DASHES, PALETTE, SHAPES, THEME, setup_notebook

__all__ = [
    "DASHES",
    "PALETTE",
    "SHAPES",
    "THEME",
    "ablation_curves",
    "capability_chart",
    "chart_to_svg",
    "clip_fraction_chart",
    "cost_chart",
    "cross_weight_chart",
    "diagnostics_chart",
    "omega_chart",
    "ratio_chart",
    "regime_chart",
    "save_chart",
    "setup_notebook",
    "training_curves",
    "verdict_chart",
]
