"""Masks other than causal (flashsim.causal.KeyMask): a boolean matrix wherever ``causal`` is accepted, and the
spec options real kernels need around them (a subtract fused only in some blocks, an LSE converted after the
kernel)."""

from __future__ import annotations

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim.causal import KeyMask, causal_visible
from flashsim.crosscheck import KernelRun, load_run, save_run
from flashsim.inputs import make_inputs
from flashsim.specs import Func, Op


def _causal_matrix(n_q: int, n_k: int) -> np.ndarray:
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None]


@pytest.mark.parametrize("policy", ["baseline_bf16", "fa2", "triton_h100"])
def test_a_causal_matrix_is_causal_bit_for_bit(policy):
    x = make_inputs("repeated", 150, 150, 64, "bf16", 7)
    a = fs.flash_forward(x["q"], x["k"], x["v"], policy, causal=True)
    b = fs.flash_forward(x["q"], x["k"], x["v"], policy, causal=KeyMask(_causal_matrix(150, 150)))
    assert np.array_equal(a.o, b.o) and np.array_equal(a.lse, b.lse)
    ga = fs.flash_backward(x["q"], x["k"], x["v"], a.o, a.lse, x["do"], policy, causal=True)
    gb = fs.flash_backward(
        x["q"], x["k"], x["v"], a.o, a.lse, x["do"], policy, causal=KeyMask(_causal_matrix(150, 150))
    )
    assert all(np.array_equal(p, q) for p, q in zip(ga, gb, strict=True))


def test_a_sliding_window_is_attention_of_its_keys():
    n, w = 130, 17
    x = make_inputs("random", n, n, 64, "bf16", 3)
    q_, k_ = np.arange(n)[:, None], np.arange(n)[None, :]
    mask = (q_ >= k_) & (q_ - k_ < w)
    r = fs.flash_forward(x["q"], x["k"], x["v"], "fp64", causal=KeyMask(mask))
    s = (x["q"].astype(np.float64) @ x["k"].T.astype(np.float64)) / 8.0
    s[~mask] = -np.inf
    p = np.exp(s - s.max(1, keepdims=True))
    want = (p / p.sum(1, keepdims=True)) @ x["v"]
    assert np.allclose(r.o, want, rtol=1e-12, atol=1e-12)


def test_blocks_of_a_matrix_mask():
    m = KeyMask(np.array([[True, False, True], [True, True, True]]))
    assert causal_visible(range(0, 2), range(0, 3), m).tolist() == [[True, False, True], [True, True, True]]
    assert causal_visible(range(1, 2), range(0, 3), m) is None
    assert causal_visible(range(0, 1), range(2, 4), m).tolist() == [[True, False]]  # keys past the last: masked
    assert m.keys_from(2).block(range(0, 2), range(0, 1)).tolist() == [[True], [True]]


def test_bad_masks_are_refused():
    with pytest.raises(ValueError, match="mask: expected a boolean"):
        KeyMask(np.ones((3, 3)))
    x = make_inputs("random", 8, 8, 16, "bf16", 1)
    with pytest.raises(ValueError, match=r"mask: expected a \(8, 8\) matrix"):
        fs.flash_forward(x["q"], x["k"], x["v"], causal=KeyMask(np.ones((8, 9), bool)))
    with pytest.raises(ValueError, match="causal: expected True/False"):
        fs.flash_forward(x["q"], x["k"], x["v"], causal=np.ones((8, 8), bool))


def test_a_run_keeps_its_mask(tmp_path):
    x = make_inputs("random", 8, 8, 16, "bf16", 1)
    mask = np.tril(np.ones((8, 8), bool)) & ~np.eye(8, k=-3, dtype=bool)
    r = fs.flash_forward(x["q"], x["k"], x["v"], "baseline_bf16", causal=KeyMask(mask))
    from flashsim.bits import to_bits

    outs = {"o": to_bits(r.o, ef.BF16)[None], "lse": to_bits(r.lse, ef.FP32)[None]}
    run = KernelRun(
        x["q"][None], x["k"][None], x["v"][None], "bf16", False, 0.25, fs.STANDARD, "baseline_bf16", outs, mask=mask
    )
    back = load_run(save_run(tmp_path / "run.npz", run))
    assert np.array_equal(back.mask, mask)
    with pytest.raises(ValueError, match="causal or has a mask matrix, not both"):
        KernelRun(
            x["q"][None], x["k"][None], x["v"][None], "bf16", True, 0.25, fs.STANDARD, "baseline_bf16", outs, mask=mask
        )


def test_spec_options_for_steps_fused_in_some_blocks_and_converted_lses():
    op = Op(ef.FP32, fused=True, unfused_in=("masked",))
    assert op.fused_in(masked=False, ragged=True) and not op.fused_in(masked=True, ragged=False)
    assert "but in masked blocks" in str(op)
    with pytest.raises(ValueError, match="Op.unfused_in"):
        Op(ef.FP32, fused=True, unfused_in=("diagonal",))
    with pytest.raises(ValueError, match="the step is not fused"):
        Op(ef.FP32, unfused_in=("masked",))
    assert Func("libdevice_log2f", ef.FP32, form="to_natural").base == "e"
    assert Func("libdevice_log2f", ef.FP32).base == "2"
