"""Objects other packages provide through entry-point groups (``flashsim.policies``, ``flashsim.families``)."""

from __future__ import annotations

import functools
from importlib import metadata
from typing import TypeVar

T = TypeVar("T")


@functools.cache
def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The group's entry points by name (installed packages' metadata, read once; nothing imported)."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def load_entry_point(ep: metadata.EntryPoint, cls: type[T], what: str, error: type[ValueError]) -> T:
    """The ``cls`` instance an entry point provides (an instance, or a function returning one).  A failing import
    or factory, another type, or an object whose ``name`` differs from the entry point's raises ``error``,
    prefixed with ``what`` (the argument's name)."""
    where = f"the {what} plugin {ep.name!r} ({ep.value}, entry-point group {ep.group!r})"
    try:
        obj = ep.load()
        obj = obj if isinstance(obj, cls) or not callable(obj) else obj()
    except Exception as exc:  # noqa: BLE001 - any failure of a third party's import or factory
        raise error(f"{what}: {where} failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, cls):
        raise error(
            f"{what}: {where} gave a {type(obj).__name__}; expected a {cls.__name__} or a function returning one"
        )
    if obj.name != ep.name:
        raise error(
            f"{what}: {where} gave a {what} named {obj.name!r}; the entry point's name must be the {what}'s name"
        )
    return obj
