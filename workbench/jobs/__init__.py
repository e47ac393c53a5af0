"""Layer 6: jobs that train or run models, above the read-only lab: comparisons, evaluations, papermill.

`compare` trains experiments under several methods and seeds, `evaluation` runs agents on held-out sets
(``python -m workbench eval``), `runner` executes the notebooks with papermill (``make demo``,
``python -m workbench reproduce``). They import `workbench.train` and `workbench.agents`; `workbench.lab`
never does, so a module of the lab only reads results. Nothing is imported here, so papermill loads only
when used.
"""
