"""Layer 5: the researcher's side: run frames, paper tables, altair plots, widgets, reports, papermill.

Import the modules you need (``from workbench.lab import plots, report``); nothing is imported here, so
altair, ipywidgets and papermill load only when used.
"""
