"""The backward's NaN encoding: a recorded case whose rows are NaN matches the kernel's bits in every output.

Recorded on the GPU by `PYTHONPATH=. python -m studies.device.record_nan_backward --out $OUT` (card and versions in
each
run's note; kept whole by `python -m tools.keep_recording nan-backward $OUT`; gpu/data/README.md): the stabilised
fix's l = 0 rows (O = 0/0) carry NaN into
delta, dS, dQ, dK and dV.  The kernels write every such NaN as 0x7FFF (bf16 and fp16) and 0x7FFFFFFF (fp32
delta), emufloat its canonical quiet NaN; `triton_policy`'s `nan_bits` on the gradients' output casts and
on delta model the hardware's encoding, as the forward's output step does.
"""

import numpy as np
import pytest

import flashsim as fs
from flashsim import arith
from flashsim.crosscheck import BACKWARD_OUTPUTS
from gpu.crosscheck.recorded import nan_runs
from gpu.policies import triton_policy
from studies.device.record_nan_backward import NAN_ROWS, nan_encodings, nan_rows_inputs, output_values

DTYPES = ("bf16", "fp16")


@pytest.fixture(scope="module", params=DTYPES)
def run(request):
    """The kept run (gpu/data/runs/nan_backward.json: its outputs' bits in nan_backward.npz)."""
    return next(r for r in nan_runs() if r.dtype == request.param)


def test_recording_is_the_constructed_case_with_nan_rows(run):
    """The inputs are `nan_rows_inputs`' (so the recording can be redone), O is NaN in those rows and
    finite elsewhere, and every backward output holds NaNs, written as the kernels write them."""
    x = nan_rows_inputs(run.dtype)
    for name in ("q", "k", "v", "do"):
        assert np.array_equal(getattr(run, name)[0], x[name]), name
    assert run.softmax.name == "stabilised" and not run.causal and run.backward
    out = run.outputs()  # the kept bits
    o = output_values(out["o"], run.dtype)[0]
    assert np.flatnonzero(np.isnan(o).any(axis=-1)).tolist() == list(NAN_ROWS)
    assert np.isfinite(np.delete(o, NAN_ROWS, axis=0)).all()
    assert np.isneginf(output_values(out["lse"], run.dtype)[0, list(NAN_ROWS)]).all()
    for name in ("o",) + BACKWARD_OUTPUTS:
        want = ["0x7fffffff"] if name == "delta" else ["0x7fff"]
        assert nan_encodings(out[name], run.dtype) == want, name


def test_backward_nan_rows_bit_identical(run):
    """Every element of O, LSE, dQ, dK, dV and delta, the NaNs' bits included."""
    rep = run.check()
    assert list(rep.checks) == ["o", "lse", "dq", "dk", "dv", "delta"]
    for c in rep.checks.values():
        assert c.identical == c.n, str(c)
    a = rep.attention  # the NaN rows are counted, first, as non-finite where attention is finite; the rest hold
    assert a.nonfinite == len(NAN_ROWS) * run.v.shape[-1] and a.beyond == 0 and not a.attention
    assert str(a).startswith(f"attention: the kernel computes another function: {a.nonfinite} non-finite")


def test_delta_nan_encoding_is_spec_data():
    """Delta.nan_bits: NaN results of delta take that encoding (None: emufloat's canonical quiet NaN); it must
    encode a NaN of delta's format."""
    a = np.float32([[np.nan, 1.0], [2.0, 3.0]])
    b = np.float32([[1.0, 1.0], [1.0, 1.0]])
    got = fs.backward.delta_rowsum(a, b, fs.specs.Delta("sequential", "fp32", nan_bits=0x7FFFFFFF))
    assert got.view(np.uint32).tolist() == [0x7FFFFFFF, 0x40A00000]
    plain = fs.backward.delta_rowsum(a, b, fs.specs.Delta("sequential", "fp32"))
    assert np.isnan(plain[0]) and plain.view(np.uint32)[0] != 0x7FFFFFFF
    assert "NaN = 0x7fffffff" in str(fs.specs.Delta("h100_tl_sum", "fp32", nan_bits=0x7FFFFFFF))
    for bad in (0x3F800000, 1 << 32, -1):
        with pytest.raises(ValueError, match="Delta.nan_bits: expected an encoding of a NaN of fp32"):
            fs.specs.Delta("sequential", "fp32", nan_bits=bad)
    with pytest.raises(ValueError, match="Delta.nan_bits: expected an encoding of a NaN of"):
        fs.specs.Delta("numpy", "fp64", nan_bits=0x7FF8000000000000)
    assert arith.nan_encoded(b, 0x7FFFFFFF) is b  # no NaN: the array itself


def test_triton_policy_encodes_backward_nans():
    for dtype in ("bf16", "fp16", "e4m3"):
        pol = triton_policy(dtype)
        assert pol.delta.nan_bits == 0x7FFFFFFF
        assert {pol.dq.out.nan_bits, pol.dk.out.nan_bits, pol.dv.out.nan_bits, pol.output.nan_bits} == {0x7FFF}
