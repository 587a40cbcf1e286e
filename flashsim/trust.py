"""Code found by name: what a name read from a file, a spec or the command line may import.

Loading data never runs code.  A name in a file (a run's metadata, a sweep spec, JSON, TOML) resolves only to
something registered: a policy or policy function registered in this process, or an object that an installed
package declares in one of flashsim's entry-point groups (``flashsim.policies``, ``flashsim.policy_functions``,
``flashsim.families``, ``flashsim.engines``).  Any other ``"module:attribute"`` is imported only when the user
allows its module: ``--allow-import MODULE`` on the command line, ``allow_import=("MODULE",)`` in Python
(``True`` allows every module).  An allowed module allows its submodules.

This module is the one place in the packages that imports code by a name known only at run time
(``tests/flashsim/test_trust.py`` reads the packages' source to keep it so).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TypeVar, Union

T = TypeVar("T")

#: what a caller passes as its opt-in: True (every module), False or () (none), or module names
AllowImport = Union[bool, Iterable[str]]  # noqa: UP007 - a runtime alias, Python 3.10 included
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ImportRefused(ValueError):
    """A name asks to import code the user did not allow; the message starts with the argument's name."""


def allowed_modules(allow: AllowImport, what: str = "allow_import") -> bool | tuple[str, ...]:
    """``allow`` checked and normalised: True, or a sorted tuple of dotted module names (empty: none)."""
    if allow is True or allow is False:
        return bool(allow)
    if isinstance(allow, str) or not isinstance(allow, Iterable):
        raise ImportRefused(
            f"{what}: expected True, False or a list of module names such as ('mypackage.policies',), got {allow!r}"
        )
    names = tuple(allow)
    for name in names:
        if not isinstance(name, str) or not _MODULE.match(name):
            raise ImportRefused(f"{what}: expected dotted module names such as mypackage.policies, got {name!r}")
    return tuple(sorted(set(names)))


def allows(allow: AllowImport, module: str) -> bool:
    """Whether the opt-in ``allow`` covers ``module`` (an allowed package covers its submodules)."""
    allowed = allowed_modules(allow)
    if allowed is True or allowed is False:
        return allowed
    return any(module == m or module.startswith(m + ".") for m in allowed)


def split_target(target: str, what: str) -> tuple[str, str]:
    """``"module:attribute.path"`` as (module, attribute path); an ImportRefused naming ``what`` otherwise."""
    module, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not _MODULE.match(module) or not _MODULE.match(attr):
        raise ImportRefused(f"{what}: expected 'module:attribute', got {target!r}")
    return module, attr


def import_target(target: str, allow: AllowImport, what: str) -> object:
    """The object ``"module:attribute"`` names, imported only where ``allow`` covers the module.

    Refused (`ImportRefused`, nothing imported): a module the user did not allow.  A module that fails
    to import or lacks the attribute raises ImportRefused saying so.
    """
    module, attr = split_target(target, what)
    if not allows(allow, module):
        raise ImportRefused(
            f"{what}: {target!r} is not registered, and flashsim imports no code that a file or an argument names "
            f"unless you allow its module: --allow-import {module} on the command line, "
            f"allow_import=({module!r},) in Python"
        )
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ImportRefused(f"{what}: cannot import {target!r} ({type(exc).__name__}: {exc})") from None
    return obj


def import_file(path: str | Path, name: str, what: str) -> ModuleType:
    """The Python file ``path`` as module ``name``: only for a file the user names on the command line for that
    purpose (a device script's ``--paper FILE``), never for a path read from data."""
    p = Path(path)
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise ImportRefused(f"{what}: {p} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---- entry points: objects installed packages declare ----------------------------------------------
@functools.cache
def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The group's entry points by name (installed packages' metadata, read once; nothing imported)."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def declared(group: str, target: str) -> metadata.EntryPoint | None:
    """The entry point of ``group`` whose value is ``target`` ("module:attribute"), if a package declares one."""
    want = target.replace(" ", "")
    return next((ep for ep in entry_points(group).values() if ep.value.replace(" ", "") == want), None)


def load_declared(ep: metadata.EntryPoint, what: str, error: type[ValueError]) -> object:
    """The object an installed package's entry point names (importing what the package declared)."""
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - any failure of a third party's import
        raise error(
            f"{what}: the plug-in {ep.name!r} ({ep.value}, entry-point group {ep.group!r}) failed to load: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def load_entry_point(ep: metadata.EntryPoint, cls: type[T], what: str, error: type[ValueError]) -> T:
    """The ``cls`` instance an entry point provides (an instance, or a function returning one).  A failing import
    or factory, another type, or an object whose ``name`` differs from the entry point's raises ``error``,
    prefixed with ``what`` (the argument's name)."""
    where = f"the {what} plugin {ep.name!r} ({ep.value}, entry-point group {ep.group!r})"
    obj = load_declared(ep, what, error)
    try:
        obj = obj if isinstance(obj, cls) or not callable(obj) else obj()
    except Exception as exc:  # noqa: BLE001 - any failure of a third party's factory
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


__all__ = [
    "AllowImport",
    "ImportRefused",
    "allowed_modules",
    "allows",
    "declared",
    "entry_points",
    "import_file",
    "import_target",
    "load_declared",
    "load_entry_point",
    "split_target",
]
