"""The FP8 forward kernel's SASS, compiled here for sm_90a by Triton (no GPU): the packed E4M3 widening that gave NaN
row sums on the GPU unpacks pairs from registers no pack wrote; the swapped form and the arithmetic one do not
(`studies.fp8_unpack_sass`)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from studies.fp8_unpack_sass import compiled_apart, sass_of, unpack_sources  # noqa: E402


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    if not triton.__version__.startswith("3.6."):
        pytest.skip(f"the SASS was read under Triton 3.6 (its ptxas); here {triton.__version__}")
    return {w: unpack_sources(sass_of(compiled_apart(w, 64))) for w in ("packed", "swapped", "arith")}


def test_the_packed_widening_unpacks_registers_no_pack_wrote(reports):
    r = reports["packed"]
    assert r["unpacks"] == 32 and r["packs"] == 32  # its conversions merged with the P V operand's
    assert len(r["strays"]) == 16


def test_the_swapped_widening_unpacks_only_its_own_packs(reports):
    r = reports["swapped"]
    assert r["unpacks"] == 32 and r["packs"] == 64 and not r["strays"]


def test_the_kernels_arithmetic_widening_unpacks_nothing(reports):
    assert reports["arith"] == {"packs": 32, "unpacks": 0, "strays": []}


def test_unpack_sources_reads_the_last_writer():
    sass = [
        "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R2, R1, R0, RZ",
        "F2FP.F16.E4M3.UNPACK_B R2, R2",
        "IADD3 R5, R5, 0x4, RZ",
        "F2FP.F16.E4M3.UNPACK_B R5, R5",
        "F2FP.F16.E4M3.UNPACK_B R7, R7",
    ]
    r = unpack_sources(sass)
    assert r["packs"] == 1 and r["unpacks"] == 3
    assert [s["last_written_by"] for s in r["strays"]] == ["IADD3 R5, R5, 0x4, RZ", None]
