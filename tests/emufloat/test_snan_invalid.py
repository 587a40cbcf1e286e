"""Signalling NaN operands raise INVALID and give a quiet NaN (IEEE 754-2019 6.2, 7.2).

Oracle: Berkeley SoftFloat through softfloatpy, which reports IEEE exception flags (its build delivers
the default NaN and keeps no payload).  It has FP16 and FP32 arithmetic and the conversions between
FP16, FP32, FP64 and BF16, but no BF16 arithmetic and no FP8.  So:

* BF16 arithmetic is judged by SoftFloat's FP32 op on the operands widened by a 16-bit shift.  A BF16
  encoding is the top half of the FP32 encoding with the same value, and the shift keeps a NaN's
  signalling bit (the top fraction bit), so the FP32 op sees the same classes (sNaN, qNaN, inf, zero,
  finite) and signals INVALID exactly when the BF16 op must; the BF16 result is SoftFloat's
  `f32_to_bf16` of the FP32 result (a quiet NaN stays a quiet NaN and raises nothing more).
* E5M2 is the top byte of FP16 in the same way: E5M2 sources are judged by SoftFloat's FP16 ones.
* Conversions SoftFloat lacks (FP16 <-> BF16, a format into itself) go through FP32 or FP64: the first
  step signals INVALID exactly when the source is an sNaN and delivers a quiet NaN, which the second
  step passes on without a flag, so the union of the flags is the one conversion's.
* FP8 and TF32 targets, min/max, sums, neg/abs and exp2 follow the IEEE rule directly: INVALID exactly
  when an operand is a signalling NaN (or the operation is invalid on non-NaN operands).

emufloat's choices (docs/emufloat.md): NaN results are the target's canonical quiet NaN; fma(0, inf,
qNaN) signals INVALID, as SoftFloat does; E4M3FN's and the FNUZ formats' single NaN is quiet; float64
operands of arithmetic count as quiet NaNs (their FP32 conversion quiets them), while a float64 *cast*
source reads its own signalling bit; neg and abs are quiet operations and never signal.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import softfloatpy as sf

import emufloat as ef

INVALID = int(ef.Flag.INVALID)
SF_INVALID = int(sf.ExceptionFlag.INVALID)

# (exp_bits, man_bits) of the IEEE-style formats (specials in the all-ones exponent)
IEEE_LAYOUT = {"fp64": (11, 52), "fp32": (8, 23), "fp16": (5, 10), "bf16": (8, 7), "e5m2": (5, 2)}
DTYPE = {
    "fp64": np.float64,
    "fp32": np.float32,
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}
UINT = {64: np.uint64, 32: np.uint32, 16: np.uint16, 8: np.uint8}
WIDTH = {"fp64": 64, "fp32": 32, "fp16": 16, "bf16": 16, "e5m2": 8, "e4m3fn": 8, "e4m3fnuz": 8, "e5m2fnuz": 8}

# Encodings by format: signalling NaNs (several payloads, both signs), quiet NaNs, and other operands.
SNAN = {
    "fp32": [0x7F800001, 0x7FBFFFFF, 0x7F812345, 0x7FA00000],
    "fp16": [0x7C01, 0x7DFF, 0x7D55, 0x7D00],
    "bf16": [0x7F81, 0x7FBF, 0x7FA5, 0x7FA0],
    "e5m2": [0x7D],
    "fp64": [0x7FF0000000000001, 0x7FF4000000000000, 0x7FF7FFFFFFFFFFFF],
}
QNAN = {
    "fp32": [0x7FC00000, 0x7FC00001, 0x7FFFFFFF],
    "fp16": [0x7E00, 0x7E01, 0x7FFF],
    "bf16": [0x7FC0, 0x7FC1, 0x7FFF],
    "e5m2": [0x7E, 0x7F],
    "fp64": [0x7FF8000000000000, 0x7FFFFFFFFFFFFFFF],
}
OTHER = {  # +0, -0, 1, -2.5, smallest subnormal, max finite, +inf, -inf
    "fp32": [0x00000000, 0x80000000, 0x3F800000, 0xC0200000, 0x00000001, 0x7F7FFFFF, 0x7F800000, 0xFF800000],
    "fp16": [0x0000, 0x8000, 0x3C00, 0xC100, 0x0001, 0x7BFF, 0x7C00, 0xFC00],
    "bf16": [0x0000, 0x8000, 0x3F80, 0xC020, 0x0001, 0x7F7F, 0x7F80, 0xFF80],
    "e5m2": [0x00, 0x80, 0x3C, 0xC1, 0x01, 0x7B, 0x7C, 0xFC],
    "fp64": [0, 0x8000000000000000, 0x3FF0000000000000, 0x7FF0000000000000],
}


def _signed(codes: list[int], width: int) -> list[int]:
    return [c | s for c in codes for s in (0, 1 << (width - 1))]


def pool(fmt: str) -> list[int]:
    """Every operand of the tests for `fmt`: sNaNs and qNaNs of both signs, then the other values."""
    w = WIDTH[fmt]
    return _signed(SNAN[fmt], w) + _signed(QNAN[fmt], w) + OTHER[fmt]


def as_array(codes, fmt: str) -> np.ndarray:
    return np.array(codes, dtype=UINT[WIDTH[fmt]]).view(DTYPE[fmt])


def is_snan(code: int, fmt: str) -> bool:
    """IEEE 754-2019 6.2.1: a NaN whose first trailing-significand bit is 0 is signalling."""
    if fmt not in IEEE_LAYOUT:
        return False  # E4M3FN and the FNUZ formats have one NaN per sign, which is quiet
    e, m = IEEE_LAYOUT[fmt]
    frac = code & ((1 << m) - 1)
    return (code >> m) & ((1 << e) - 1) == (1 << e) - 1 and frac != 0 and not frac >> (m - 1)


def is_nan(code: int, fmt: str) -> bool:
    if fmt in IEEE_LAYOUT:
        e, m = IEEE_LAYOUT[fmt]
        return (code >> m) & ((1 << e) - 1) == (1 << e) - 1 and code & ((1 << m) - 1) != 0
    if fmt == "e4m3fn":
        return code & 0x7F == 0x7F
    return code == 0x80  # fnuz


def is_quiet_nan(code: int, fmt: str) -> bool:
    return is_nan(code, fmt) and not is_snan(code, fmt)


def bits_of(arr: np.ndarray) -> list[int]:
    arr = np.ascontiguousarray(arr)
    return [int(v) for v in arr.reshape(-1).view(UINT[arr.dtype.itemsize * 8])]


# ---- SoftFloat -----------------------------------------------------------------------------------------

SF_TYPE = {"fp16": sf.Float16, "fp32": sf.Float32, "fp64": sf.Float64, "bf16": sf.BFloat16}
SF_OPS = {
    "fp16": {
        "add": sf.f16_add,
        "sub": sf.f16_sub,
        "mul": sf.f16_mul,
        "div": sf.f16_div,
        "fma": sf.f16_mul_add,
        "sqrt": sf.f16_sqrt,
    },
    "fp32": {
        "add": sf.f32_add,
        "sub": sf.f32_sub,
        "mul": sf.f32_mul,
        "div": sf.f32_div,
        "fma": sf.f32_mul_add,
        "sqrt": sf.f32_sqrt,
    },
}


def sf_value(code: int, fmt: str):
    return SF_TYPE[fmt].from_bytes(code.to_bytes(WIDTH[fmt] // 8, "big"))


def sf_code(x) -> int:
    return int.from_bytes(x.to_bytes(), "big")


def sf_call(fn, *args):
    """(result, flags) of one SoftFloat call, from cleared flags."""
    sf.set_exception_flags(0)
    r = fn(*args)
    return r, sf.get_exception_flags()


def sf_arith(op: str, fmt: str, codes: tuple[int, ...]) -> tuple[int, int]:
    """(result encoding in `fmt`, SoftFloat flags) of `op` on encodings of `fmt` (fp16, fp32, bf16)."""
    if fmt == "bf16":  # widened exactly to FP32 (see the module docstring)
        r, fl = sf_call(SF_OPS["fp32"][op], *(sf_value(c << 16, "fp32") for c in codes))
        r2, fl2 = sf_call(sf.f32_to_bf16, r)
        return sf_code(r2), fl | fl2
    r, fl = sf_call(SF_OPS[fmt][op], *(sf_value(c, fmt) for c in codes))
    return sf_code(r), fl


# ---- arithmetic ----------------------------------------------------------------------------------------

ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "fma": 3, "sqrt": 1}


def combos(fmt: str, arity: int) -> list[tuple[int, ...]]:
    return list(itertools.product(pool(fmt), repeat=arity))


def zero_times_inf(a: int, b: int, fmt: str) -> bool:
    e, m = IEEE_LAYOUT[fmt]
    mag = (1 << (e + m)) - 1
    inf = ((1 << e) - 1) << m
    return {a & mag, b & mag} == {0, inf}


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("op", list(ARITY))
def test_arith_snan_signals_invalid(op, fmt):
    """Every combination of sNaN, qNaN and other operands: INVALID as SoftFloat raises it, NaN results quiet."""
    cs = combos(fmt, ARITY[op])
    cols = [as_array([c[j] for c in cs], fmt) for j in range(ARITY[op])]
    want = [sf_arith(op, fmt, c) for c in cs]
    for mode in ("rne", "rdown"):
        tr = ef.Trace()
        got = getattr(ef, op)(*cols, fmt, mode, trace=tr)
        untraced = getattr(ef, op)(*cols, fmt, mode)
        flags = [int(f) for f in tr.flags]
        for k, (c, (wbits, wfl), gbits, ubits, gfl) in enumerate(
            zip(cs, want, bits_of(got), bits_of(untraced), flags, strict=True)
        ):
            where = f"{op}{tuple(hex(v) for v in c)} {fmt} {mode} #{k}"
            assert bool(gfl & INVALID) == bool(wfl & SF_INVALID), where
            assert is_nan(gbits, fmt) == is_nan(wbits, fmt), where
            assert is_nan(ubits, fmt) == is_nan(gbits, fmt), where
            if is_nan(gbits, fmt):
                assert is_quiet_nan(gbits, fmt) and is_quiet_nan(ubits, fmt), where
                assert gfl & ~INVALID == 0, where  # no other flag on a NaN result
            # the IEEE rule, stated directly
            snan = any(is_snan(v, fmt) for v in c)
            qnan = any(is_quiet_nan(v, fmt) for v in c)
            if snan:
                assert gfl & INVALID and is_quiet_nan(gbits, fmt), where
            elif qnan:
                fma_0_inf = op == "fma" and zero_times_inf(c[0], c[1], fmt)
                assert bool(gfl & INVALID) == fma_0_inf, where
                assert is_quiet_nan(gbits, fmt), where


def test_fma_zero_times_inf_plus_qnan_signals():
    """The implementation-defined case of IEEE 754-2019 7.2(c): emufloat signals, as SoftFloat does."""
    z, inf, q = (as_array([v], "fp32") for v in (0x80000000, 0x7F800000, 0x7FC00000))
    for a, b in ((z, inf), (inf, z)):
        tr = ef.Trace()
        r = ef.fma(a, b, q, "fp32", trace=tr)
        assert np.isnan(r[0]) and tr.flags[0] == INVALID
        _r, fl = sf_call(
            sf.f32_mul_add,
            sf_value(bits_of(a)[0], "fp32"),
            sf_value(bits_of(b)[0], "fp32"),
            sf_value(0x7FC00000, "fp32"),
        )
        assert fl & SF_INVALID


def _widened_to_fp32(codes: list[int], fmt: str) -> list[int]:
    return [c << 16 for c in codes] if fmt == "bf16" else codes


@pytest.mark.parametrize("src, dst", [("fp32", "bf16"), ("fp32", "fp16"), ("bf16", "fp32")])
@pytest.mark.parametrize("op", ["add", "mul", "div", "sqrt"])
def test_arith_snan_into_other_formats(op, src, dst):
    """Operands of one format rounded into another: the FP32 op (SoftFloat) then the conversion."""
    cs = combos(src, ARITY[op])
    cols = [as_array([c[j] for c in cs], src) for j in range(ARITY[op])]
    tr = ef.Trace()
    got = bits_of(getattr(ef, op)(*cols, dst, trace=tr))
    to_dst = {"bf16": sf.f32_to_bf16, "fp16": sf.f32_to_f16, "fp32": lambda x: x}[dst]
    for c, gbits, gfl in zip(cs, got, tr.flags, strict=True):
        r, fl = sf_call(SF_OPS["fp32"][op], *(sf_value(v, "fp32") for v in _widened_to_fp32(list(c), src)))
        r2, fl2 = sf_call(to_dst, r)
        where = f"{op}{tuple(hex(v) for v in c)} {src}->{dst}"
        assert bool(int(gfl) & INVALID) == bool((fl | fl2) & SF_INVALID), where
        assert is_nan(gbits, dst) == is_nan(sf_code(r2), dst), where
        if is_nan(gbits, dst):
            assert is_quiet_nan(gbits, dst), where


def test_mixed_precision_fma_snan():
    """fma(bf16, bf16, fp32) into FP32: SoftFloat f32_mulAdd on the widened BF16 operands."""
    cs = list(itertools.product(pool("bf16")[:14:3], pool("bf16")[::3], pool("fp32")))
    a = as_array([c[0] for c in cs], "bf16")
    b = as_array([c[1] for c in cs], "bf16")
    c32 = as_array([c[2] for c in cs], "fp32")
    tr = ef.Trace()
    got = bits_of(ef.fma(a, b, c32, fmt="fp32", trace=tr))
    for c, gbits, gfl in zip(cs, got, tr.flags, strict=True):
        r, fl = sf_call(
            sf.f32_mul_add, sf_value(c[0] << 16, "fp32"), sf_value(c[1] << 16, "fp32"), sf_value(c[2], "fp32")
        )
        where = f"fma{tuple(hex(v) for v in c)}"
        assert bool(int(gfl) & INVALID) == bool(fl & SF_INVALID), where
        assert is_nan(gbits, "fp32") == is_nan(sf_code(r), "fp32"), where
        if is_nan(gbits, "fp32"):
            assert is_quiet_nan(gbits, "fp32"), where


def test_float64_operand_nan_is_quiet():
    """float64 operands carry FP32 values: a float64 NaN, signalling bit or not, counts as quiet."""
    x = as_array(_signed(SNAN["fp64"] + QNAN["fp64"], 64), "fp64")
    for y in (np.float32(1.0), 1.0, float("nan")):
        tr = ef.Trace()
        r = ef.add(x, y, "fp32", trace=tr)
        assert np.isnan(r).all() and not tr.has("invalid").any()
    tr = ef.Trace()
    ef.mul(float("nan"), as_array([0x7F800001], "fp32"), "fp32", trace=tr)  # the FP32 sNaN still signals
    assert tr.flags[0] == INVALID


def test_neg_and_abs_are_quiet():
    """IEEE 754-2019 5.5.1: negate and abs signal nothing, even for an sNaN; the result is a quiet NaN."""
    for fmt in ("fp16", "bf16", "fp32"):
        x = as_array(pool(fmt), fmt)
        for fn in (ef.neg, ef.abs):
            tr = ef.Trace()
            got = bits_of(fn(x, trace=tr))
            assert not tr.has("invalid").any()
            for c, g in zip(pool(fmt), got, strict=True):
                assert is_nan(g, fmt) == is_nan(c, fmt)
                if is_nan(g, fmt):
                    assert is_quiet_nan(g, fmt)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
def test_minmax_snan_signals(fmt):
    """IEEE 754-2019 9.6 and 7.2(a): minimum/maximum return a quiet NaN for any NaN operand,
    minimumNumber/maximumNumber the number when only one operand is NaN; all four signal INVALID
    exactly when an operand is a signalling NaN (also when the number is returned)."""
    cs = combos(fmt, 2)
    a = as_array([c[0] for c in cs], fmt)
    b = as_array([c[1] for c in cs], fmt)
    for fn, propagate in itertools.product((ef.minimum, ef.maximum), (True, False)):
        tr = ef.Trace()
        got = bits_of(fn(a, b, fmt, propagate_nan=propagate, trace=tr))
        for c, g, fl in zip(cs, got, tr.flags, strict=True):
            where = f"{fn.__name__}{tuple(hex(v) for v in c)} propagate_nan={propagate}"
            assert bool(int(fl) & INVALID) == any(is_snan(v, fmt) for v in c), where
            nans = [is_nan(v, fmt) for v in c]
            if propagate and any(nans) or all(nans):
                assert is_quiet_nan(g, fmt), where
            elif any(nans):
                assert g == c[1] if nans[0] else g == c[0], where
            else:
                assert not is_nan(g, fmt), where


def test_sum_snan_signals():
    """sum: a signalling NaN term signals INVALID; quiet NaN terms alone do not (inf - inf still does
    when no term is NaN)."""
    s, q, one, inf = 0x7FA00000, 0x7FC00000, 0x3F800000, 0x7F800000  # s: an sNaN in FP32 and in BF16 (>> 16)
    rows = [
        [one, s, one],
        [one, q, one],
        [q, s | 1 << 31, inf],
        [inf, inf | 1 << 31, one],
        [inf, inf | 1 << 31, q],
        [one, one, one],
    ]
    want_invalid = [True, False, True, True, False, False]
    for fmt, shift in (("fp32", 0), ("bf16", 16)):
        x = as_array([[v >> shift for v in r] for r in rows], fmt)
        for out in ("fp32", "bf16"):
            tr = ef.Trace()
            got = bits_of(ef.sum(x, out, trace=tr))
            assert [bool(int(f) & INVALID) for f in tr.flags] == want_invalid, (fmt, out)
            for g, w in zip(got, want_invalid, strict=True):
                assert is_quiet_nan(g, out) or not w


def test_tree_sum_snan_signals_like_add():
    """tree_sum's add events signal INVALID where an addend is a signalling-NaN leaf, as ef.add does."""
    n = 8
    tree = ef.ReductionTree.pairwise(n)
    x = np.ones((3, n), np.float32).view(np.uint32)
    x[0, 3] = 0x7F800001
    x[1, 0] = 0xFFA00000
    x[2, 5] = 0x7FC00000
    x = x.view(np.float32)
    tr = ef.Trace()
    ef.tree_sum(x, tree, "bf16", trace=tr)
    prog = tree.program
    flags = tr.flags.reshape(3, n - 1)
    for r in range(3):
        for k, (i, j) in enumerate(prog):
            leaf_snan = any(p < n and is_snan(bits_of(x[r, p : p + 1])[0], "fp32") for p in (i, j))
            assert bool(int(flags[r, k]) & INVALID) == leaf_snan, (r, k)


def test_exp2_snan_signals():
    x = as_array(pool("fp32"), "fp32")
    tr = ef.Trace()
    got = bits_of(ef.exp2(x, "bf16", trace=tr))
    for c, g, fl in zip(pool("fp32"), got, tr.flags, strict=True):
        assert bool(int(fl) & INVALID) == is_snan(c, "fp32"), hex(c)
        if is_nan(c, "fp32"):
            assert is_quiet_nan(g, "bf16")


# ---- casts ---------------------------------------------------------------------------------------------


def _via(*fns):
    def run(x):
        flags = 0
        for fn in fns:
            x, fl = sf_call(fn, x)
            flags |= fl
        return x, flags

    return run


SF_CAST = {
    ("fp32", "fp16"): _via(sf.f32_to_f16),
    ("fp32", "bf16"): _via(sf.f32_to_bf16),
    ("fp32", "fp32"): _via(sf.f32_to_f64, sf.f64_to_f32),
    ("fp16", "fp32"): _via(sf.f16_to_f32),
    ("fp16", "bf16"): _via(sf.f16_to_f32, sf.f32_to_bf16),
    ("fp16", "fp16"): _via(sf.f16_to_f64, sf.f64_to_f16),
    ("bf16", "fp32"): _via(sf.bf16_to_f32),
    ("bf16", "fp16"): _via(sf.bf16_to_f32, sf.f32_to_f16),
    ("bf16", "bf16"): _via(sf.bf16_to_f32, sf.f32_to_bf16),
    ("fp64", "fp32"): _via(sf.f64_to_f32),
    ("fp64", "fp16"): _via(sf.f64_to_f16),
    ("fp64", "bf16"): _via(sf.f64_to_f32, sf.f32_to_bf16),
}
NAN_TARGETS = ["fp32", "fp16", "bf16", "tf32", "e5m2", "e4m3fn", "e4m3fnuz", "e5m2fnuz"]


def _sf_source(code: int, src: str):
    if src == "e5m2":
        return sf_value(code << 8, "fp16"), "fp16"
    return sf_value(code, src), src


@pytest.mark.parametrize("src", ["fp32", "fp16", "bf16", "e5m2", "fp64"])
@pytest.mark.parametrize("dst", NAN_TARGETS)
def test_cast_snan_signals(src, dst):
    """A cast of a signalling NaN signals INVALID and gives the target's quiet NaN of the same sign
    (one unsigned NaN in FNUZ formats); a quiet NaN or a number signals nothing.  SoftFloat judges
    the casts between FP16, BF16, FP32 and FP64 (E5M2 as the top byte of FP16)."""
    codes = pool(src)
    x = as_array(codes, src)
    for mode in ("rne", "rtz"):
        tr = ef.Trace()
        r = ef.quantize(x, dst, mode, trace=tr)
        untraced = ef.quantize(x, dst, mode)
        out = "fp32" if dst == "tf32" else dst  # TF32's carrier is float32
        for c, g, u, fl in zip(codes, bits_of(r), bits_of(untraced), tr.flags, strict=True):
            where = f"{hex(c)} {src}->{dst} {mode}"
            fl = int(fl)
            assert g == u, where
            if is_nan(c, src):
                assert bool(fl & INVALID) == is_snan(c, src), where
                assert fl & ~INVALID == 0, where
                assert is_quiet_nan(g, out), where
                if not dst.endswith("fnuz"):
                    assert g >> (WIDTH.get(out, 32) - 1) == c >> (WIDTH[src] - 1), where
            elif not (dst in ("e4m3fn", "e4m3fnuz", "e5m2fnuz") and is_nan(g, out)):  # inf into NaN-only formats
                assert not fl & INVALID, where
            sf_src, sf_fmt = _sf_source(c, src)
            if (sf_fmt, dst) in SF_CAST:
                w, wfl = SF_CAST[(sf_fmt, dst)](sf_src)
                assert bool(fl & INVALID) == bool(wfl & SF_INVALID), where
                assert is_nan(g, dst) == is_nan(sf_code(w), dst), where


@pytest.mark.parametrize("src", ["e4m3fn", "e4m3fnuz", "e5m2fnuz"])
def test_single_nan_formats_are_quiet(src):
    """E4M3FN's 0x7F/0xFF and the FNUZ formats' 0x80 are their only NaNs: quiet, so no INVALID."""
    codes = [0x7F, 0xFF] if src == "e4m3fn" else [0x80]
    x = as_array(codes, src)
    for dst in ("fp32", "bf16", "e5m2", src):
        tr = ef.Trace()
        r = ef.quantize(x, dst, trace=tr)
        assert not tr.has("invalid").any() and np.isnan(r.astype(np.float32)).all()
        tr = ef.Trace()
        ef.add(x, x, "fp32", trace=tr)
        assert not tr.has("invalid").any()


@pytest.mark.parametrize("dst", ["e2m1", "e2m3", "e3m2"])
def test_snan_into_formats_without_nan_raises(dst):
    """Formats without NaN cannot hold the quiet NaN an sNaN becomes: the call raises, as for any NaN."""
    for src in ("fp32", "fp16", "bf16"):
        with pytest.raises(ValueError, match="NaN"):
            ef.quantize(as_array(SNAN[src][:1], src), dst, trace=ef.Trace())
        with pytest.raises(ValueError, match="NaN"):
            ef.add(as_array(SNAN[src][:1], src), 1.0, dst)


def test_format_is_signalling():
    """Format.is_signalling and has_signalling_nan agree with the IEEE rule on every 8- and 16-bit encoding."""
    for name in ("fp16", "bf16", "e5m2", "e4m3fn", "e4m3fnuz", "e5m2fnuz", "e2m1"):
        fmt = ef.as_format(name)
        w = fmt.width
        codes = np.arange(1 << w, dtype=np.uint32)
        got = fmt.is_signalling(codes)
        want = np.array([name in IEEE_LAYOUT and is_snan(int(c), name) for c in codes])
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert fmt.has_signalling_nan == bool(want.any()), name
    assert ef.FP32.is_signalling(0x7F800001) and not ef.FP32.is_signalling(0x7FC00000)
    assert ef.TF32.has_signalling_nan and not ef.Format(3, 1).has_signalling_nan
