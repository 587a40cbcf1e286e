"""cuBLAS's bf16 GEMMs against outputs recorded on an H200 (tests/data/cublas_gemms): each kernel family's
`emufloat.accum.TiledK` model gives every element, and each of its parts (residue-first order, split-K, the
step width) is seen: without it some kept case misses."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
from emufloat.accum import TiledK
from emufloat.hw import cublas, h100
from studies.device.cublas_gemms import operands

DATA = Path(__file__).parents[1] / "data" / "cublas_gemms"
META = json.loads((DATA / "cublas_gemms.json").read_text())
CASES = dict(zip(META["kept"], META["cases"], strict=True))
#: the split count cuBLAS chose for each kept split-K launch (the recording does not list it): the count that
#: fits every recorded launch of that K, form and head dim (several fit some single launches)
SPLITS = {10: 4, 40: 3, 74: 7}


def _family(kernels: list[str]) -> str:
    name = kernels[0].split("<")[-1].split(">")[0].split("_align")[0]
    return name.split("_h_")[0] + ("+splitK" if len(kernels) > 1 else "")


@functools.cache
def _operands(index: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of a kept case as (B, M, K), (B, K, N): ``dv`` multiplies by a's transpose."""
    c = CASES[index]
    a, b = operands(c["form"], c["batch"], c["n"], c["d"], c["seed"])
    return (np.ascontiguousarray(np.swapaxes(a, 1, 2)) if c["form"] == "dv" else a), b


def _misses(index: int, model) -> int:
    """Output elements whose bf16 bits differ from the recording's under ``model``."""
    a, b = _operands(index)
    got = ef.quantize(ef.matmul(a, b, model), ef.BF16).view(np.uint16)
    want = np.load(DATA / "cublas_gemms.npz")[f"g{index}"]
    assert got.shape == want.shape
    return int((got != want).sum())


def _model(index: int):
    return cublas.kernel_model(CASES[index]["kernels"], SPLITS.get(index))


@pytest.mark.parametrize("index", sorted(CASES), ids=[f"{i}-{_family(CASES[i]['kernels'])}" for i in sorted(CASES)])
def test_every_recorded_element_is_the_models(index):
    assert _misses(index, _model(index)) == 0


def _natural(m: TiledK) -> TiledK:
    return TiledK(m.step, m.tile, residue_first=False, splits=m.splits)


def _no_split(m: TiledK) -> TiledK:
    return TiledK(m.step, m.tile)


def _other_step(m: TiledK) -> TiledK:
    other = h100.MMA_K8_BF16 if m.step == h100.WGMMA_BF16 else h100.WGMMA_BF16
    return TiledK(other, max(m.tile, other.width), splits=m.splits)


@pytest.mark.parametrize(
    "index, change",
    [(18, _natural), (43, _natural), (77, _natural), (79, _natural)]
    + [(10, _no_split), (40, _no_split), (74, _no_split)]
    + [(10, _other_step), (27, _other_step), (43, _other_step), (74, _other_step)],
)
def test_each_part_of_the_model_is_seen(index, change):
    assert _misses(index, change(_model(index))) > 0


def test_layout_puts_the_residue_first_and_splits_as_cutlass_does():
    m = TiledK(h100.WGMMA_BF16, tile=32)
    (pos,) = m.layout(35)
    assert pos.tolist() == [0, 1, 2] + [-1] * 29 + list(range(3, 35))
    assert TiledK(h100.WGMMA_BF16, 32, residue_first=False).layout(35)[0].tolist() == list(range(35)) + [-1] * 29
    assert m.layout(64)[0].tolist() == list(range(64))
    split = TiledK(h100.MMA_K8_BF16, 32, splits=4)
    assert split.slices(129) == [(0, 40), (40, 80), (80, 120), (120, 129)]
    assert [len(p) for p in split.layout(129)] == [64, 64, 64, 32]
    assert TiledK(h100.MMA_K8_BF16, 32, splits=8).slices(489)[-1] == (448, 489)
    assert TiledK(h100.MMA_K8_BF16, 0, splits=4).slices(10) == [(0, 8), (8, 10), (10, 10), (10, 10)]


def test_split_k_is_chains_from_zero_added_in_fp32():
    a, b = _operands(10)
    m = _model(10)
    parts = [ef.matmul(a[..., lo:hi], b[..., lo:hi, :], TiledK(m.step, 32)) for lo, hi in m.slices(a.shape[-1])]
    want = parts[0]
    for p in parts[1:]:
        want = want + p
    got = ef.matmul(a, b, m)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # a 2-D call and dot give the batched call's bits
    assert np.array_equal(ef.matmul(a[0], b[0], m), got[0])
    assert ef.dot(a[0, 3], b[0, :, 5], m) == got[0, 3, 5]


def test_presets_and_kernel_names():
    assert ef.accum.PRESETS["cublas_cutlass_k64_bf16"] is cublas.CUTLASS_K64_BF16
    assert TiledK("h100_mma_k8_bf16", 32).step is h100.MMA_K8_BF16
    assert cublas.kernel_model(["nvjet_sm90_tst_64x8_64x16_1x4_h_bz_NNT"]) is h100.WGMMA_BF16
    assert cublas.kernel_model(CASES[43]["kernels"]) is cublas.CUTLASS_K32_BF16
    assert cublas.kernel_model(CASES[77]["kernels"]) is cublas.CUTLASS_K64_BF16
    assert cublas.kernel_model(CASES[16]["kernels"]) is cublas.CUTLASS_K128_BF16
    split = cublas.kernel_model(CASES[10]["kernels"], 4)
    assert (split.step, split.tile, split.splits, split.residue_first) == (h100.MMA_K8_BF16, 32, 4, True)
    assert cublas.kernel_model(CASES[74]["kernels"], 7).step is h100.WGMMA_BF16
    # unsplit s1688 (Qiu & Yao's launches, tests/data/fresh_check/fresh_5.json): one slice of the split arrangement
    alone = cublas.kernel_model(["cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1"])
    assert (alone.step, alone.tile, alone.splits) == (h100.MMA_K8_BF16, 32, 1)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: TiledK(h100.WGMMA_BF16, tile=24), r"tile: expected 0 or a multiple of step.width \(16\), got 24"),
        (lambda: TiledK(h100.WGMMA_BF16, tile=-32), r"tile: expected an integer >= 0, got -32"),
        (lambda: TiledK(h100.WGMMA_BF16, 32, splits=0), r"splits: expected an integer >= 1, got 0"),
        (lambda: TiledK(h100.WGMMA_BF16, 32, split_align=2.0), r"split_align: expected an integer >= 1, got 2.0"),
        (lambda: TiledK(h100.WGMMA_BF16, 32, residue_first="yes"), r"residue_first: expected True or False"),
        (lambda: TiledK(ef.Sequential(), 32), r"step: expected a FusedBlock .*, got Sequential"),
        (lambda: TiledK("no_such_model", 32), r"model: unknown preset 'no_such_model'"),
        (lambda: cublas.kernel_model(["gemv_kernel"]), r"kernels: no model for 'gemv_kernel'; accepted: nvjet_sm90"),
        (lambda: cublas.kernel_model(CASES[10]["kernels"]), r"splits: the launch ran splitKreduce_kernel"),
        (lambda: cublas.kernel_model(CASES[43]["kernels"], 3), r"splits: the launch ran no splitKreduce_kernel"),
        (lambda: cublas.kernel_model("nvjet_sm90"), r"kernels: expected a non-empty list"),
    ],
)
def test_bad_parameters_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_matmul_refuses_c_trace_and_mismatched_shapes():
    a, b = np.ones((2, 40), np.float32), np.ones((40, 3), np.float32)
    m = cublas.CUTLASS_K32_BF16
    with pytest.raises(ValueError, match="c: a TiledK model starts every chain from C = 0"):
        ef.matmul(a, b, m, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="trace: a TiledK model records no trace"):
        ef.matmul(a, b, m, trace=ef.Trace())
    with pytest.raises(ValueError, match=r"a, b: expected shapes \(M, K\) and \(K, N\)"):
        ef.matmul(a, b[:39], m)
    assert ef.matmul(a, b, m).tolist() == [[40.0] * 3] * 2
