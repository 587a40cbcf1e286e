"""emufloat's boundary with its hardware rooms: the rooms build on public modules only, `import emufloat`
imports no room, a preset's name imports its room on first use, and the top-level namespace stays small."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
from emufloat import accum, lowlevel

ROOT = Path(__file__).resolve().parents[2]
HW = ROOT / "emufloat" / "hw"


def _private_imports(src: str, module: str) -> list[str]:
    """`line: what` for each import of a private emufloat module or name in the source of `module` (a
    module or attribute whose name starts with '_'), and each `_name` read off a name imported from
    emufloat."""
    package = module.split(".")[:-1]
    tree = ast.parse(src, module)
    found: list[str] = []
    bound: set[str] = set()  # local names bound by imports from emufloat

    def private(dotted: str) -> bool:
        return any(part.startswith("_") for part in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "emufloat":
                    bound.add(alias.asname or "emufloat")
                    if private(alias.name):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if source.split(".")[0] != "emufloat":
                continue
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if private(source) or alias.name.startswith("_"):
                    found.append(f"{node.lineno}: from {source} import {alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and node.attr.startswith("_")
            and not (node.attr.startswith("__") and node.attr.endswith("__"))
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_hardware_rooms_import_only_public_emufloat_modules():
    files = sorted(HW.rglob("*.py"))
    assert len(files) > 5 and HW / "h100" / "ex2.py" in files
    found = [
        f"{f.relative_to(ROOT)}:{hit}"
        for f in files
        for hit in _private_imports(f.read_text(), ".".join(f.relative_to(ROOT).with_suffix("").parts))
    ]
    assert not found, "emufloat/hw uses private emufloat modules (use emufloat.lowlevel):\n" + "\n".join(found)


def test_the_scan_sees_private_imports():
    src = (
        "import numpy as np\n"
        "import emufloat._core\n"
        "from numba import _helperlib\n"  # not emufloat's
        "from ... import _arrays, ops\n"
        "from ..._fastpath import BLOCK\n"
        "from ...lowlevel import pow2\n"
        "from .common import _grid\n"
        "x = ops._arith_kernel, np._NoValue, ops.__name__\n"
    )
    hits = [h.split(": ", 1)[1] for h in _private_imports(src, "emufloat.hw.h100.ex2")]
    assert hits == [
        "import emufloat._core",
        "from emufloat import _arrays",
        "from emufloat._fastpath import BLOCK",
        "from emufloat.hw.h100.common import _grid",
        "ops._arith_kernel",
    ]


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return res.stdout.strip()


def test_import_emufloat_imports_no_hardware_room():
    assert _run("import sys, emufloat; print(sorted(m for m in sys.modules if m.startswith('emufloat.hw')))") == "[]"


def test_a_preset_name_resolves_once_its_room_is_imported():
    out = _run(
        "import numpy as np, emufloat as ef\n"
        "a = ef.quantize(np.linspace(-1, 1, 64).reshape(2, 32), 'bf16')\n"
        "try:\n    ef.matmul(a, a.T, 'h100_wgmma_bf16')\n"
        "except ValueError as e:\n    print('refused', 'import emufloat.hw.h100' in str(e))\n"
        "from emufloat.hw import h100\n"
        "got = ef.matmul(a, a.T, 'h100_wgmma_bf16')\n"
        "print(np.array_equal(got.view(np.uint32), ef.matmul(a, a.T, h100.WGMMA_BF16).view(np.uint32)))"
    )
    assert out == "refused True\nTrue"


def test_the_room_registers_every_preset_it_names():
    from emufloat.hw import h100

    for name, model in h100.PRESETS.items():
        assert accum.PRESETS[name] is model


def test_presets_is_a_read_only_mapping_and_register_refuses_a_taken_name():
    assert "h100_wgmma_bf16" in dict(accum.PRESETS) and "no_such_model" not in accum.PRESETS
    with pytest.raises(TypeError):
        accum.PRESETS["mine"] = ef.Exact()  # type: ignore[index]
    with pytest.raises(ValueError, match="already registered"):
        accum.register(ef.FusedBlock(width=8, name="h100_wgmma_bf16"))
    with pytest.raises(ValueError, match=r"unknown preset 'h200'; accepted: \[.*'h100_wgmma_bf16'"):
        ef.matmul(np.zeros((1, 2), np.float32), np.zeros((2, 1), np.float32), "h200")


def test_a_model_registered_by_the_user_resolves_by_name():
    mine = ef.Sequential(ef.FP32, name="test_device_api_sequential")
    try:
        accum.register(mine)
        accum.register(mine)  # the same model again: accepted
        a = np.float32([[1.0, 2.0**-24, 2.0**-24]])
        np.testing.assert_array_equal(ef.matmul(a, a.T, mine.name), ef.matmul(a, a.T, mine))
    finally:
        accum._REGISTERED.pop(mine.name, None)


def test_the_top_level_namespace_is_small_and_moved_names_live_in_their_modules():
    assert len(ef.__all__) <= 40 and len(set(ef.__all__)) == len(ef.__all__)
    assert all(hasattr(ef, name) for name in ef.__all__)
    from emufloat.formats import E2M1, E2M3, E3M2, E4M3FNUZ, E5M2FNUZ
    from emufloat.rounding import MODES, stochastic_bits
    from emufloat.trace import TraceSummary, sign_test

    assert ef.as_format("e2m1") is E2M1 and ef.as_format("float8_e4m3fnuz") is E4M3FNUZ
    assert {E2M3.name, E3M2.name, E5M2FNUZ.name} == {"e2m3", "e3m2", "e5m2fnuz"}
    assert "rne" in MODES and callable(stochastic_bits) and callable(sign_test)
    assert isinstance(ef.Trace().summary(), TraceSummary)


def test_lowlevel_names_are_few_and_documented():
    assert len(lowlevel.__all__) <= 12
    for name in lowlevel.__all__:
        assert hasattr(lowlevel, name)
        assert f"`{name}`" in lowlevel.__doc__ or f"`{name}()`" in lowlevel.__doc__, (
            f"emufloat.lowlevel's docstring does not list {name}"
        )


def test_fp32_bits_checks_as_arithmetic_does():
    arr, bits = lowlevel.fp32_bits(np.float64([[1.5, -0.0]]), "x")
    assert arr.shape == (1, 2) and bits.tolist() == [0x3FC00000, 0x80000000]
    with pytest.raises(ValueError, match="x: float64 values must be exactly representable in FP32"):
        lowlevel.fp32_bits(np.float64(0.1), "x")
    with pytest.raises(TypeError, match="x: expected a floating-point array"):
        lowlevel.fp32_bits(np.int32([1]), "x")
