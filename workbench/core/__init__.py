"""Layer 0: records (`types`), the HACPO math (`capability`, `advantages`, `losses`), atomic I/O, settings.

Imports torch and the standard library only. `workbench.hacpo` re-exports the math in one import.
This ``__init__`` imports nothing, so ``workbench.core.types`` stays importable without torch.
"""
