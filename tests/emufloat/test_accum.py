"""Accumulation models against independent references (Fractions, numpy float32 loops)."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat.hw import h100


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
        for x, y in zip(a[k0 : k0 + width], b[k0 : k0 + width], strict=True):
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
        acc = (acc + (a[:, k : k + 1] * b[k : k + 1, :]).astype(np.float32)).astype(np.float32)
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
        got = ef.dot(a, b, h100.WGMMA_BF16, c)
        want = _block_reference(a.astype(np.float64), b.astype(np.float64), c, 16, 25, ef.BF16.emin, ef.BF16.emin)
        assert float(got) == want


def test_fused_block_alignment_and_truncation_cases_from_the_notes():
    def probe(small, c=1.0):
        a = np.zeros(16, ml_dtypes.bfloat16)
        b = np.zeros(16, ml_dtypes.bfloat16)
        a[0], b[0] = -small, 1.0
        return float(ef.dot(a, b, h100.WGMMA_BF16, np.float32(c)))

    assert probe(2.0**-25) == 1 - 2.0**-24  # 1 - 2**-25 survives the cut, then RZ
    assert probe(2.0**-26) == 1.0  # cut away entirely
    a = np.zeros(32, ml_dtypes.bfloat16)
    b = np.zeros(32, ml_dtypes.bfloat16)
    a[0], a[1], b[0], b[1] = 1, 2.0**-26, 1, 1
    a2 = a.copy()
    a2[1], a2[16] = 0, 2.0**-26
    assert float(ef.dot(a, b, h100.WGMMA_BF16)) == 1.0  # one step: 2**-26 is below the 25-bit cut of 1
    assert float(ef.dot(a2, b, h100.WGMMA_BF16)) == 1.0


def test_fused_block_traces_alignment_and_rounding():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 3)).astype(ml_dtypes.bfloat16)
    tr = ef.Trace()
    out = ef.matmul(a, b, h100.WGMMA_BF16, trace=tr, label="qk")
    assert [c[:2] for c in tr.calls] == [("align", "fp32"), ("dot_step", "fp32")]
    assert len(tr) == 2 * 2 * 3 * 4
    last = tr.select(tr.op_names == "dot_step")["rounded"].reshape(2, 3, 4)[:, :, -1]
    np.testing.assert_array_equal(last.astype(np.float32), out)


def test_model_arguments_are_checked():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="a, b: expected shapes"):
        ef.matmul(x, x, ef.Exact())
    with pytest.raises(TypeError, match="model"):  # no default: the caller names the accumulation
        ef.matmul(x, x.T)
    with pytest.raises(TypeError, match="model"):
        ef.dot(x[0], x[0])
    with pytest.raises(ValueError, match="model: unknown preset 'h200'"):
        ef.matmul(x, x.T, "h200")
    with pytest.raises(TypeError, match="model: expected Sequential"):
        ef.matmul(x, x.T, 3)
    with pytest.raises(ValueError, match="width must be >= 1"):
        ef.FusedBlock(width=0)
    with pytest.raises(ValueError, match=r"c: expected shape \(2, 2\)"):
        ef.matmul(x, x.T, ef.Exact(), c=np.zeros((3, 3), np.float32))


_STRESS_DTYPES = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "fp32": np.float32,
}


def _stress_operand(rng, shape, dtype, spread, p_special):
    """Wide exponent spreads (so subnormals and flushed zeros), zeros of both signs, infinities and NaNs."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    x[rng.random(shape) < 0.1] = 0.0
    x[rng.random(shape) < 0.03] = -0.0
    special = rng.random(shape) < p_special
    x[special] = rng.choice([np.inf, -np.inf, np.nan], int(special.sum()))
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(dtype)


@pytest.mark.parametrize("name", sorted(_STRESS_DTYPES))
def test_fused_block_fast_path_matches_the_traced_general_path(name):
    """Untraced FusedBlock calls take the float64 fast path, traced ones the general one: same bits."""
    fp8 = name in ("e4m3fn", "e5m2")
    acc = ef.Format(8, 13) if fp8 else ef.FP32
    models = [
        h100.WGMMA_FP8 if fp8 else h100.WGMMA_BF16,
        ef.FusedBlock(width=16, align_bits=25, early_c=False, zeros_in_max=True, min_exp=-140, acc_fmt=acc),
        ef.FusedBlock(width=4, align_bits=3, final_rounding=ef.Rounding("rne"), acc_fmt=acc),
        ef.FusedBlock(width=8, align_bits=40, final_rounding=ef.Rounding("rup"), zeros_in_max=True),
        ef.FusedBlock(width=32, align_bits=13, acc_fmt=acc, chunk=64, final_rounding=ef.Rounding("rdown")),
        ef.FusedBlock(width=16, align_bits=20, final_rounding=ef.Rounding("rto"), inf_on_overflow=False),
        ef.FusedBlock(width=5, align_bits=30, final_rounding=ef.Rounding("rna"), min_exp=-20),
    ]
    rng = np.random.default_rng(sorted(_STRESS_DTYPES).index(name))
    for model in models:
        for m, k, n in [(5, 37, 70), (17, 96, 9), (1, 130, 3)]:
            for spread in (2, 30, 160):
                for p_special in (0.0, 0.004):
                    a = _stress_operand(rng, (m, k), _STRESS_DTYPES[name], spread, p_special)
                    b = _stress_operand(rng, (k, n), _STRESS_DTYPES[name], spread, p_special)
                    c = (rng.standard_normal((m, n)) * np.exp2(rng.integers(-40, 40, (m, n)))).astype(np.float32)
                    c[rng.random((m, n)) < 0.1] = 0
                    c[rng.random((m, n)) < 0.02] = rng.choice([np.inf, -np.inf, np.nan, 3e38, -3e38])
                    for cc in (None, c):
                        fast = ef.matmul(a, b, model, cc)
                        general = ef.matmul(a, b, model, cc, trace=ef.Trace())
                        differ = fast.view(np.uint32) != general.view(np.uint32)
                        assert not differ.any(), (
                            model,
                            m,
                            k,
                            n,
                            spread,
                            p_special,
                            cc is not None,
                            fast[differ][:4],
                            general[differ][:4],
                        )


def test_fused_block_overflow_in_the_fast_path():
    a = np.full((4, 64), 2.0**120, np.float32)
    b = np.full((64, 4), 2.0**10, np.float32)
    b[::3] *= -1
    for c in (None, np.full((4, 4), -3e38, np.float32)):
        for model in (h100.WGMMA_BF16, ef.FusedBlock(inf_on_overflow=False)):
            fast = ef.matmul(a, b, model, c)
            general = ef.matmul(a, b, model, c, trace=ef.Trace())
            np.testing.assert_array_equal(fast.view(np.uint32), general.view(np.uint32))
    assert np.isinf(ef.matmul(a, b, h100.WGMMA_BF16)).all()


@pytest.mark.parametrize("name", ["bf16", "e4m3fn"])
def test_a_batch_of_products_is_each_product(name):
    """(B, M, K) @ (B, K, N): the untraced FusedBlock batch runs as one kernel call, each product the bits of the
    traced general path (term by term) on its own operands, specials included; other models and traced calls
    loop over the batch."""
    fp8 = name == "e4m3fn"
    acc = ef.Format(8, 13) if fp8 else ef.FP32
    rng = np.random.default_rng(7)
    dtype = _STRESS_DTYPES[name]
    models = [
        h100.WGMMA_FP8_PROMOTED if fp8 else h100.WGMMA_BF16,
        ef.FusedBlock(width=4, align_bits=3, final_rounding=ef.Rounding("rne"), acc_fmt=acc),
        ef.Sequential(),
    ]
    for model in models:
        for batch, m, k, n in [(3, 1, 64, 64), (2, 9, 37, 70), (4, 2, 16, 3)]:
            a = np.stack([_stress_operand(rng, (m, k), dtype, 30, 0.004) for _ in range(batch)])
            b = np.stack([_stress_operand(rng, (k, n), dtype, 30, 0.004) for _ in range(batch)])
            c = rng.standard_normal((batch, m, n)).astype(np.float32)
            for cc in (None, c):
                got = ef.matmul(a, b, model, cc)
                assert got.shape == (batch, m, n)
                for i in range(batch):
                    want = ef.matmul(a[i], b[i], model, None if cc is None else cc[i], trace=ef.Trace())
                    assert np.array_equal(got[i].view(np.uint32), want.view(np.uint32)), (model, batch, m, k, n, i)
    with pytest.raises(ValueError, match=r"\(B, M, K\) and \(B, K, N\)"):
        ef.matmul(np.zeros((2, 3, 4)), np.zeros((3, 4, 5)), h100.WGMMA_BF16)
    with pytest.raises(ValueError, match="c: expected shape"):
        ef.matmul(np.zeros((2, 3, 4)), np.zeros((2, 4, 5)), h100.WGMMA_BF16, np.zeros((2, 3, 4)))
