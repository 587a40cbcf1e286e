"""The shape of the repository, read from its source: imports point one way (gpu -> flashsim -> emufloat; studies
-> packages, never back), no import cycle among the packages' modules, and the library imports neither the
studies nor the repository's tools, tests or benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("emufloat", "flashsim", "gpu")
OUTSIDE = ("studies", "tools", "tests", "benchmarks", "examples")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """The modules `path` imports (relative imports resolved); `top_level_only`: only statements run at
    import (not inside functions, not under `if TYPE_CHECKING`)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # imports for type checkers only never run
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # the body, and the bodies of top-level try/if blocks
        flat = []
        for node in nodes:
            if isinstance(node, (ast.Try, ast.If)):
                flat += [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
            else:
                flat.append(node)
        nodes = flat
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def package_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_the_library_imports_nothing_outside_it():
    bad = [
        f"{p.relative_to(ROOT)} imports {m}" for p in package_files() for m in imports(p) if m.split(".")[0] in OUTSIDE
    ]
    assert bad == []


@pytest.mark.parametrize("lower, higher", [("emufloat", "flashsim"), ("emufloat", "gpu"), ("flashsim", "gpu")])
def test_imports_point_down(lower, higher):
    bad = [
        f"{p.relative_to(ROOT)} imports {m}"
        for p in sorted((ROOT / lower).rglob("*.py"))
        for m in imports(p)
        if m.split(".")[0] == higher
    ]
    assert bad == []


def test_no_import_cycle_among_the_packages_modules():
    """Module-level imports between the packages' modules form no cycle (a cycle hidden by an import inside a
    function counts too: those are followed as well)."""
    files = {module_name(p): p for p in package_files()}
    graph = {m: {i for i in imports(p) if i in files and i != m} for m, p in files.items()}
    # a package's own __init__ imports its submodules: that edge and the submodule's use of the package's siblings
    # through it are not a cycle of the code's structure
    for m in graph:
        graph[m] = {i for i in graph[m] if not m.startswith(i + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_launcher_imports_no_policy():
    """gpu.flash runs kernels; which policy repeats a launch is gpu.policies' business, not the launcher's."""
    assert not {m for m in imports(ROOT / "gpu" / "flash.py") if m.startswith("gpu.policies")}
