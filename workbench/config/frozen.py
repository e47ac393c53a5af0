"""An immutable mapping for config values: task knobs and the switches that define an ablation.

A frozen dataclass is only as immutable as its fields: a ``dict`` inside it can still change after
validation and makes the config unhashable. `FrozenMap` is a read-only ``Mapping`` (so ``**knobs`` still
works) that hashes, pickles and compares equal to a ``dict`` with the same items. `freeze` turns plain YAML
data into it (lists become tuples, mappings `FrozenMap`); `thaw` turns it back into plain YAML data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["FrozenMap", "freeze", "thaw"]

_SCALARS = (str, int, float, bool, type(None))


class FrozenMap(Mapping[str, Any]):
    """A read-only, hashable, picklable mapping of str keys to frozen YAML values.

    Args:
        data: A mapping (or ``FrozenMap``) of str keys; nested lists become tuples, nested mappings
            ``FrozenMap``.

    Raises:
        TypeError: A non-str key, or a value that is not YAML data (names its key path).
    """

    __slots__ = ("_items",)

    def __init__(self, data: Mapping[str, Any] | None = None, /) -> None:
        items = {} if data is None else data
        if not isinstance(items, Mapping):
            raise TypeError(f"expected a mapping, got {type(items).__name__} {items!r}")
        object.__setattr__(self, "_items", {k: freeze(v, str(k)) for k, v in _str_keys(items).items()})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"FrozenMap is immutable: cannot set {name!r}")

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (FrozenMap, (self._items,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def _str_keys(items: Mapping[Any, Any]) -> Mapping[str, Any]:
    bad = [k for k in items if not isinstance(k, str)]
    if bad:
        raise TypeError(f"keys must be str, got {bad[0]!r} ({type(bad[0]).__name__})")
    return items


def freeze(value: Any, where: str = "value") -> Any:
    """Plain YAML data made immutable: mappings → `FrozenMap`, lists and tuples → tuples, scalars as is.

    Raises:
        TypeError: A value that YAML cannot represent (names ``where`` and the value).
    """
    if isinstance(value, (FrozenMap, *_SCALARS)):
        return value
    if isinstance(value, Mapping):
        return FrozenMap(value)
    if isinstance(value, list | tuple):
        return tuple(freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(
        f"{where} = {value!r} is not allowed: a str, number, bool, null, list or mapping "
        f"(got {type(value).__name__})"
    )


def thaw(value: Any) -> Any:
    """The inverse of `freeze`: `FrozenMap` → dict, tuples → lists (what ``yaml.safe_dump`` writes); a
    dataclass instance (a ``task.rewards`` entry) becomes the mapping of its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: thaw(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
