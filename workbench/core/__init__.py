"""Layer 0: records (`types`), the HACPO math (`advantages`, `losses`) and its knobs' ranges, atomic I/O.

Imports torch and the standard library only. `workbench.hacpo` re-exports the math in one import.
This ``__init__`` imports nothing, so ``workbench.core.types`` stays importable without torch.
"""
