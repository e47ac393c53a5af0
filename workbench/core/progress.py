"""Progress bars inside a training step: rollout, scoring, update and evaluation (``tqdm.auto``).

``tqdm.auto`` draws a text bar in a terminal and a widget in JupyterLab. Bars are quiet where nobody watches
them: under pytest, in notebooks executed by papermill (the runner sets ``HACPO_PROGRESS=0``), or wherever
``HACPO_PROGRESS=0`` is set (`workbench.core.env.progress_enabled`). Each closes when its phase ends
(``leave=False``): what remains is the step's one log line, which says how long each phase took.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

from workbench.core import env

__all__ = ["bar", "ticking"]

T = TypeVar("T")


def bar(total: int | None, desc: str, unit: str = "it", *, leave: bool = False, **kwargs: Any) -> tqdm:
    """A ``tqdm.auto`` bar, disabled when progress is quiet (module docstring)."""
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, disable=not env.progress_enabled(), **kwargs)


def ticking(
    items: Iterable[T], desc: str, unit: str = "it", *, weight: Callable[[T], int] | None = None
) -> Iterator[T]:
    """``items`` one by one, a bar advancing by ``weight(item)`` (default 1) once each is done."""
    items = list(items)
    total = sum(weight(i) for i in items) if weight else len(items)
    with bar(total, desc, unit) as progress:
        for item in items:
            yield item
            progress.update(weight(item) if weight else 1)
