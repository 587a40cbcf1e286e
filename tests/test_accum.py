"""Accumulation models against independent references (Fractions, numpy float32 loops)."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef


def _frac(x) -> Fraction:
    return Fraction(float(x))


def _round_fp32_rtz(q: Fraction) -> float:
    """Truncate an exact rational to FP32 (oracle: gfloat-free, by bracketing with numpy nextafter)."""
    f = np.float32(float(q))
    while _frac(f) > q and q >= 0 or _frac(f) < q and q < 0:
        f = np.nextafter(f, np.float32(0))
    while abs(_frac(np.nextafter(f, np.float32(np.inf if q > 0 else -np.inf)))) <= abs(q):
        f = np.nextafter(f, np.float32(np.inf if q > 0 else -np.inf))
    return float(f)


def _block_reference(a, b, c, width, align_bits, emin_a, emin_b):
    """Scalar Fraction model of a FusedBlock chain (early C, truncation, RZ into FP32)."""
    acc = None if c is None else _frac(c)
    for k0 in range(0, len(a), width):
        terms = []
        exps = []
        for x, y in zip(a[k0:k0 + width], b[k0:k0 + width], strict=True):
            p = _frac(x) * _frac(y)
            if p:
                ex = max(int(np.floor(np.log2(abs(float(x))))), emin_a)
                ey = max(int(np.floor(np.log2(abs(float(y))))), emin_b)
                exps.append(ex + ey)
                terms.append(p)
        if acc:
            exps.append(int(np.floor(np.log2(abs(float(acc))))))
            terms.append(acc)
        if not terms:
            acc = Fraction(0) if acc is None else acc
            continue
        quantum = Fraction(2) ** (max(exps) - align_bits)
        total = sum((int(abs(t) / quantum) * quantum * (1 if t > 0 else -1) for t in terms), Fraction(0))
        acc = Fraction(_round_fp32_rtz(total)) if total else Fraction(0)
    return float(acc)


def test_exact_model_is_the_exact_dot_product():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 50)) * np.exp2(rng.integers(-60, 60, (3, 50)))).astype(np.float32)
    b = (rng.standard_normal((50, 4)) * np.exp2(rng.integers(-60, 60, (50, 4)))).astype(np.float32)
    got = ef.matmul(a, b, ef.Exact())
    for i in range(3):
        for j in range(4):
            exact = sum(_frac(a[i, k]) * _frac(b[k, j]) for k in range(50))
            assert got[i, j] == np.float32(float(exact)) or abs(_frac(got[i, j]) - exact) <= abs(exact) * 2**-24


def test_sequential_unfused_matches_a_numpy_float32_loop():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 100)).astype(np.float32)
    b = rng.standard_normal((100, 3)).astype(np.float32)
    acc = np.zeros((4, 3), np.float32)
    for k in range(100):
        acc = (acc + (a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(ef.matmul(a, b, ef.Sequential(fused=False)), acc)


def test_pairwise_matches_an_explicit_tree():
    rng = np.random.default_rng(2)
    a = rng.standard_normal(13).astype(np.float32)
    b = rng.standard_normal(13).astype(np.float32)
    vals = [np.float32(x * y) for x, y in zip(a, b, strict=True)]
    while len(vals) > 1:
        nxt = [np.float32(vals[i] + vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    assert float(ef.dot(a, b, ef.Pairwise())) == float(vals[0])


@pytest.mark.parametrize("k", [16, 48, 64, 100])
@pytest.mark.parametrize("with_c", [False, True])
def test_fused_block_matches_the_scalar_fraction_model(k, with_c):
    rng = np.random.default_rng(k + with_c)
    for _ in range(40):
        a = (rng.standard_normal(k) * np.exp2(rng.integers(-20, 20, k))).astype(ml_dtypes.bfloat16)
        b = (rng.standard_normal(k) * np.exp2(rng.integers(-20, 20, k))).astype(ml_dtypes.bfloat16)
        a[rng.random(k) < 0.2] = 0
        c = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-10, 30)) if with_c else None
        got = ef.dot(a, b, ef.H100_WGMMA_BF16, c)
        want = _block_reference(a.astype(np.float64), b.astype(np.float64), c, 16, 25, ef.BF16.emin, ef.BF16.emin)
        assert float(got) == want


def test_fused_block_alignment_and_truncation_cases_from_the_notes():
    def probe(small, c=1.0):
        a = np.zeros(16, ml_dtypes.bfloat16)
        b = np.zeros(16, ml_dtypes.bfloat16)
        a[0], b[0] = -small, 1.0
        return float(ef.dot(a, b, ef.H100_WGMMA_BF16, np.float32(c)))

    assert probe(2.0**-25) == 1 - 2.0**-24  # 1 - 2**-25 survives the cut, then RZ
    assert probe(2.0**-26) == 1.0  # cut away entirely
    a = np.zeros(32, ml_dtypes.bfloat16)
    b = np.zeros(32, ml_dtypes.bfloat16)
    a[0], a[1], b[0], b[1] = 1, 2.0**-26, 1, 1
    a2 = a.copy()
    a2[1], a2[16] = 0, 2.0**-26
    assert float(ef.dot(a, b)) == 1.0  # one step: 2**-26 is below the 25-bit cut of 1
    assert float(ef.dot(a2, b)) == 1.0


def test_fused_block_traces_alignment_and_rounding():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 3)).astype(ml_dtypes.bfloat16)
    tr = ef.Trace()
    out = ef.matmul(a, b, trace=tr, label="qk")
    assert [c[:2] for c in tr.calls] == [("align", "fp32"), ("dot_step", "fp32")]
    assert len(tr) == 2 * 2 * 3 * 4
    last = tr.select(tr.op_names == "dot_step")["rounded"].reshape(2, 3, 4)[:, :, -1]
    np.testing.assert_array_equal(last.astype(np.float32), out)


def test_model_arguments_are_checked():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="a, b: expected shapes"):
        ef.matmul(x, x)
    with pytest.raises(ValueError, match="model: unknown preset 'h200'"):
        ef.matmul(x, x.T, "h200")
    with pytest.raises(TypeError, match="model: expected Sequential"):
        ef.matmul(x, x.T, 3)
    with pytest.raises(ValueError, match="width must be >= 1"):
        ef.FusedBlock(width=0)
    with pytest.raises(ValueError, match=r"c: expected shape \(2, 2\)"):
        ef.matmul(x, x.T, c=np.zeros((3, 3), np.float32))
