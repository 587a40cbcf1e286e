"""Causal masking with M queries and N keys: top-left (PyTorch's is_causal) and bottom-right
(FlashAttention-2 >= 2.1, PyTorch's causal_lower_right), against an explicit FP64 mask and against torch."""

import contextlib

import numpy as np
import pytest

import flashsim as fs
from flashsim.causal import causal_alignment, causal_offset

SHAPES = [(3, 10), (10, 3), (7, 7), (1, 300)]


def inputs(m, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, 8)), rng.standard_normal((n, 8)), rng.standard_normal((n, 5))


def masked_attention(q, k, v, offset):
    """Softmax attention in float64 with key j hidden from query i when j > i + offset (NaN: no key)."""
    s = q @ k.T / np.sqrt(q.shape[1])
    visible = np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None] + offset
    s = np.where(visible, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return (p / p.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize("m, n", SHAPES)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_forward_matches_an_explicit_mask(m, n, align):
    q, k, v = inputs(m, n)
    offset = 0 if align == "top-left" else n - m
    want = masked_attention(q, k, v, offset)
    for block in (2, 4, 64):  # block skipping must follow the alignment too
        got = fs.flash_forward(q, k, v, "fp64", causal=align, block_m=block, block_n=block).o
        assert np.allclose(got, want, rtol=1e-13, atol=1e-15, equal_nan=True)
    assert np.array_equal(np.isnan(want).any(axis=1), np.arange(m) + offset < 0)  # rows that see no key


def test_true_means_top_left_and_false_no_mask():
    q, k, v = inputs(3, 10)
    a = fs.flash_forward(q, k, v, "fp64", causal=True).o
    b = fs.flash_forward(q, k, v, "fp64", causal="top-left").o
    assert np.array_equal(a, b)
    assert causal_alignment(False) is None and causal_offset(None, 3, 10) is None
    assert causal_offset("bottom-right", 3, 10) == 7 and causal_offset(True, 3, 10) == 0
    with pytest.raises(ValueError, match="causal: expected True/False, one of top-left, bottom-right or a"):
        fs.flash_forward(q, k, v, "fp64", causal="lower-right")


@pytest.mark.parametrize("m, n", [(3, 10), (6, 6)])
def test_stepper_and_backward_follow_the_alignment(m, n):
    q, k, v = inputs(m, n, seed=1)
    f = fs.flash_forward(q, k, v, "fp64", causal="bottom-right", block_m=2, block_n=2)
    st = fs.step_rows(q, k, v, "fp64", rows=m - 1, causal="bottom-right", block_m=2, block_n=2).run()
    assert np.array_equal(st.result.o, f.o[m - 1 : m]) and st.causal == "bottom-right"
    do = np.random.default_rng(2).standard_normal((m, 5))
    tiled = fs.flash_backward(q, k, v, f.o, f.lse, do, "fp64", causal="bottom-right", block_m=2, block_n=2)
    whole = fs.reference_backward(q, k, v, f.o, f.lse, do, "fp64", causal="bottom-right")
    for a, b in zip(tiled, whole, strict=True):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("m, n", [(3, 10), (7, 7), (10, 4)])
def test_against_torch(m, n):
    torch = pytest.importorskip("torch")
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = inputs(m, n, seed=3)
    do = np.random.default_rng(4).standard_normal((m, 5))
    tq, tk, tv = (torch.from_numpy(x)[None, None].requires_grad_() for x in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with pytest.warns(UserWarning) if m > n else contextlib.nullcontext():
        mask = causal_lower_right(m, n)
    o_br = sdpa(tq, tk, tv, attn_mask=mask)
    o_br.backward(torch.from_numpy(do)[None, None])
    f = fs.flash_forward(q, k, v, "fp64", causal="bottom-right", block_m=4, block_n=4)
    seen = np.arange(m) + (n - m) >= 0  # torch writes 0 where a row sees no key; flashsim's arithmetic NaN
    assert np.allclose(f.o[seen], o_br[0, 0].detach().numpy()[seen], rtol=1e-12, atol=1e-14)
    if seen.all():
        b = fs.flash_backward(q, k, v, f.o, f.lse, do, "fp64", causal="bottom-right", block_m=4, block_n=4)
        for ours, t in zip(b[:3], (tq, tk, tv), strict=True):
            assert np.allclose(ours, t.grad[0, 0].numpy(), rtol=1e-10, atol=1e-12)
    o_tl = sdpa(*(x.detach() for x in (tq, tk, tv)), is_causal=True)
    got = fs.flash_forward(q, k, v, "fp64", causal="top-left", block_m=4, block_n=4).o
    assert np.allclose(got, o_tl[0, 0].numpy(), rtol=1e-12, atol=1e-14)
