"""Extending flashsim by adding values: a row-sum order, a division, a function model, a device's accumulation
model, a recompute form, an LSE form and a split merge are registered from this file and policies using them run,
with no change to any package module; and flashsim's core stays free of any particular device."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim import arith
from flashsim.orders import (
    COMBINES,
    DIVISIONS,
    LSE_FORMS,
    RECOMPUTES,
    ROW_SUMS,
    CombineMethod,
    Division,
    LseForm,
    RecomputeForm,
)
from flashsim.specs import Combine, Dot, Func, Norm, Recompute, RowSum, Tiling

ROOT = Path(__file__).resolve().parents[2]
CALLS: dict[str, int] = {}


class RightToLeft(arith.BlockSumOrder):
    """A kernel that sums each block's P from its last column to its first, in FP32."""

    name, doc = "test_right_to_left", "right to left, each add rounded to FP32 (a test's own order)"

    def block_sum(self, p, spec, tile, trace, label):
        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        return arith.tree_rowsum(p[:, ::-1], ef.ReductionTree.sequential(p.shape[-1]), spec, trace, label)


class MultiplyByReciprocal(Division):
    """O = acc * fl32(1 / l), the reciprocal correctly rounded (a test's own division)."""

    name, doc, methods, hardware = "test_reciprocal", "1/l rounded to FP32, then a multiply", ("reciprocal",), True

    def reciprocal(self, l, spec, trace, label):
        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        return (np.float64(1.0) / np.asarray(l, np.float64)).astype(np.float32)


def truncated_exp2(x, trace=None, label=""):
    """2**x rounded toward zero into FP32 (a made-up special-function unit)."""
    CALLS["test_exp2_rtz"] = CALLS.get("test_exp2_rtz", 0) + 1
    return ef.quantize(np.exp2(np.asarray(x, np.float64)), "fp32", "rtz")


class OneRounding(RecomputeForm):
    """x = S*c - L computed exactly and rounded once into FP32 (a test's own recompute form)."""

    name, doc = "test_one_rounding", "S*c - L exact, one rounding"

    def exponent(self, s, head, rows, visible, trace):
        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        x = np.asarray(s, np.float64) * np.float64(head.c) - np.asarray(
            head.l[rows.start : rows.stop, None], np.float64
        )
        if visible is not None:
            x[~visible] = -np.inf
        return x.astype(np.float32)


class ExactLse(LseForm):
    """LSE = m*c + log l exact, rounded once (a test's own LSE form)."""

    name, doc = "test_exact_lse", "m*c + log l exact, one rounding"

    def join(self, m, log_l, k, spec, trace):
        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        m64 = np.asarray(m, np.float64) * (1.0 if k is None else k)
        return (m64 + np.asarray(log_l, np.float64)).astype(np.float32)


class EvenExactMerge(CombineMethod):
    """Keys dealt in equal counts (not whole blocks), the splits merged in FP64 (a test's own split merge)."""

    name, doc = "test_even_exact", "equal key counts, FP64 merge"

    def ranges(self, n, block_n, splits):
        edges = np.linspace(0, n, splits + 1).astype(int)
        return [range(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]

    def combine(self, results, policy, trace):
        CALLS[self.name] = CALLS.get(self.name, 0) + 1
        lse = np.stack([np.asarray(r[1], np.float64) for r in results])  # natural-log LSEs under 'fp32'
        top = lse.max(axis=0)
        w = np.exp(lse - top)
        total = np.log(w.sum(axis=0)) + top
        o = sum(np.exp(x - total)[:, None] * np.asarray(r[0], np.float64) for x, r in zip(lse, results, strict=True))
        return o.astype(np.float32), total.astype(np.float32)


#: a made-up tensor core: blocks of 32 products fused, 20 alignment bits kept, the sum rounded toward zero
NEW_CORE = ef.FusedBlock(width=32, align_bits=20, final_rounding=ef.Rounding("rtz"), name="test_core_fp32")


@pytest.fixture(scope="module")
def registered():
    ROW_SUMS.register(RightToLeft(), replace=True)
    DIVISIONS.register(MultiplyByReciprocal(), replace=True)
    fs.register_function(fs.FunctionModel("test_exp2_rtz", "exp", "2", "2**x rounded toward zero", truncated_exp2))
    ef.accum.register(NEW_CORE)
    RECOMPUTES.register(OneRounding(), replace=True)
    LSE_FORMS.register(ExactLse(), replace=True)
    COMBINES.register(EvenExactMerge(), replace=True)


def test_a_policy_of_new_values_runs_and_calls_them(registered):
    rng = np.random.default_rng(3)
    q, k, v = (ef.quantize(rng.standard_normal((40, 16)), "bf16").astype(np.float32) for _ in range(3))
    base = fs.get_policy("triton_h100")
    pol = dataclasses.replace(
        base,
        name="test_new_device",
        scores=Dot(ef.BF16, "test_core_fp32"),
        exp=Func("test_exp2_rtz", ef.FP32),
        row_sum=RowSum("test_right_to_left", ef.FP32),
        normalize=Norm("reciprocal", "test_reciprocal", ef.FP32),
    )
    assert "test_right_to_left" in str(pol) and "test_reciprocal" in str(pol) and "test_exp2_rtz" in str(pol)
    CALLS.clear()
    out = fs.flash_forward(q, k, v, pol, block_n=16)
    assert {"test_right_to_left", "test_reciprocal", "test_exp2_rtz"} <= set(CALLS)
    assert CALLS["test_right_to_left"] == -(-40 // 16) * -(-40 // base.tiling.block_m)  # one per (Q, K/V) block
    exact = fs.reference_attention(q, k, v, "fp64")
    assert np.max(np.abs(out.o.astype(np.float64) - exact.o)) < 0.05  # a device that still computes attention
    assert not np.array_equal(out.lse, fs.flash_forward(q, k, v, base, block_n=16).lse)  # and not the H100's


def test_the_new_row_sum_order_sums_right_to_left(registered):
    p = np.float32([[1.0, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24]])
    spec = RowSum("test_right_to_left", ef.FP32)
    state = arith.RowSumState(1, spec, (1, 5), None)
    state.update(p, np.zeros(1, np.float32))
    want = np.float32(0)
    for x in p[0, ::-1]:  # numpy float32, right to left: the small terms add up before 1 absorbs them
        want = np.float32(want + x)
    assert state.total()[0] == want == np.float32(1.0 + 2.0**-22)
    left = arith.RowSumState(1, RowSum("sequential", ef.FP32), (1, 5), None)
    left.update(p, np.zeros(1, np.float32))
    assert left.total()[0] == np.float32(1.0)  # left to right, each 2**-24 is lost


def test_new_forms_and_merge_run_and_are_called(registered):
    rng = np.random.default_rng(5)
    q, k, v, do = (ef.quantize(rng.standard_normal((48, 16)), "bf16").astype(np.float32) for _ in range(4))
    base = fs.get_policy("triton_h100")
    pol = dataclasses.replace(
        base,
        name="test_new_forms",
        lse=dataclasses.replace(base.lse, form="test_exact_lse"),
        recompute=Recompute(base.recompute.function, ef.FP32, form="test_one_rounding"),
    )
    assert "test_one_rounding" in str(pol)
    CALLS.clear()
    fwd = fs.flash_forward(q, k, v, pol, block_n=16)
    grads = fs.flash_backward(q, k, v, fwd.o, fwd.lse, do, pol)
    assert CALLS["test_exact_lse"] >= 1 and CALLS["test_one_rounding"] >= 1
    ref = fs.reference_attention(q, k, v, "fp64")
    exact = fs.reference_backward(q, k, v, ref.o, ref.lse, do, "fp64")
    for name in ("dq", "dk", "dv"):
        assert np.max(np.abs(getattr(grads, name) - getattr(exact, name))) < 0.05, name
    plain = fs.flash_backward(q, k, v, fwd.o, fwd.lse, do, dataclasses.replace(pol, recompute=base.recompute))
    for name in ("dq", "dk", "dv"):  # the kernel's FMA rounds x once too: the same bits
        assert np.array_equal(getattr(plain, name), getattr(grads, name)), name

    split = dataclasses.replace(
        fs.FP32_POLICY, name="test_split", tiling=Tiling(16, 16, kv_splits=3), combine=Combine(method="test_even_exact")
    )
    CALLS.clear()
    out = fs.flash_forward(q, k, v, split)
    assert CALLS["test_even_exact"] == 1
    assert np.max(np.abs(out.o - ref.o)) < 1e-5 and np.max(np.abs(out.lse - ref.lse)) < 1e-5


def test_an_unknown_name_is_refused_listing_the_registered_ones():
    with pytest.raises(ValueError, match=r"RowSum.order: expected one of \[.*'h100_tl_sum'.*'sequential'"):
        RowSum("no_such_order", ef.FP32)
    with pytest.raises(ValueError, match="Norm.division: expected one of"):
        Norm("divide", "no_such_division", ef.FP32)


def test_flashsims_core_imports_no_device():
    """Only flashsim.devices (what particular GPUs compute) imports emufloat.hw."""
    found = []
    for path in sorted((ROOT / "flashsim").rglob("*.py")):
        if "devices" in path.relative_to(ROOT / "flashsim").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith(("emufloat.hw", "emufloat.hw."))]
    assert found == []
