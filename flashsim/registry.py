"""Named objects a policy refers to, in open registries: the module that defines a kernel's row-sum order, a
division or a delta order registers it, and specs name it, so that adding one is a new file, not an edit of
flashsim's core."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects of one kind by their ``name``: `register()` adds one, `get()` finds one (an instance passes
    through), a ValueError naming the argument and the accepted names otherwise."""

    def __init__(self, kind: str, cls: type[T]):
        self.kind, self.cls = kind, cls
        self._items: dict[str, T] = {}

    def register(self, obj: T, *, replace: bool = False) -> T:
        """Make ``obj`` available under ``obj.name``; another object under a taken name needs ``replace=True``."""
        if not isinstance(obj, self.cls):
            raise TypeError(f"{self.kind}: expected a {self.cls.__name__}, got {type(obj).__name__}")
        name = getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: expected a non-empty name, got {name!r}")
        old = self._items.get(name)
        if old is not None and old is not obj and old != obj and not replace:
            raise ValueError(f"{self.kind}: another {self.kind} is registered as {name!r}; pass replace=True")
        self._items[name] = obj
        return obj

    def get(self, name: str | T, argname: str | None = None) -> T:
        """The object registered as ``name`` (a registered instance passes through)."""
        if isinstance(name, self.cls):
            name = name.name  # type: ignore[attr-defined]
        obj = self._items.get(name) if isinstance(name, str) else None
        if obj is None:
            raise ValueError(f"{argname or self.kind}: expected one of {self.names()}, got {name!r}")
        return obj

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items.values())


__all__ = ["Registry"]
