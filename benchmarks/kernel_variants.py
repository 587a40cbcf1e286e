"""Kernel modules for experiments (docs/experiments/): a committed kernel file with a patch applied, or the
file as it was at a commit, imported under a name of its own.  Triton and Gluon read a kernel's source from
its module's file, so each variant is written to a temporary file first; relative imports (``from .fwd``)
become absolute (``from gpu.kernels.fwd``), so that the copy shares the committed helpers."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from types import ModuleType


def patched(name: str, target: str, patch: str) -> ModuleType:
    """Module ``name``: ``target`` (a path from the repository root) with ``patch`` applied."""
    def write(path: str) -> None:
        subprocess.run(["patch", "-s", "-o", path, target, patch], check=True)
    with open(target, "rb") as f, open(patch, "rb") as g:
        key = hashlib.sha1(f.read() + g.read()).hexdigest()[:12]
    return _load(name, target, write, key)


def at_commit(name: str, commit: str, target: str) -> ModuleType:
    """Module ``name``: ``target`` as it was at ``commit`` (``git show``).  Its relative imports resolve to
    this tree's modules, not the commit's."""
    def write(path: str) -> None:
        with open(path, "w") as f:
            f.write(subprocess.run(["git", "show", f"{commit}:{target}"], check=True, capture_output=True,
                                   text=True).stdout)
    return _load(name, target, write, commit)


def _load(name: str, target: str, write, key: str) -> ModuleType:
    """Import the variant that ``write`` writes, from a temporary file named by ``key`` (what it was made
    from), so that a changed patch is never served from an earlier run's file."""
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(tempfile.gettempdir(), f"{name}_{key}.py")
    if not os.path.exists(path):  # written beside it, then renamed: parallel warm-up processes race here
        tmp = f"{path}.{os.getpid()}"
        write(tmp)
        package = os.path.dirname(target).replace("/", ".")
        with open(tmp) as f:
            src = re.sub(r"^from \.(\w)", rf"from {package}.\1", f.read(), flags=re.M)
        with open(tmp, "w") as f:
            f.write(src)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]
