"""emufloat casts (quantize / encode / decode) against ml_dtypes and gfloat, bit for bit.

ml_dtypes is the reference for round-to-nearest-even casts from float32; gfloat
for every mode (round-to-odd built on its toward-zero result, stochastic
rounding as its StochasticFastest with emufloat's documented random integers).
Every check compares encodings or (value, sign) pairs, which are the same thing
for non-NaN values; NaN results are compared by NaN-ness and sign.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat.rounding import stochastic_bits
from tools.oracles import (
    ML_DTYPE,
    MODES,
    all_patterns,
    assert_same,
    build_info,
    gf_decode,
    gf_round,
    gfloat_info,
    nan_has_sign,
)

# ml_dtypes NaN -> float64 casts warn "invalid value"; the NaNs are intended
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

ALL_MODES = (*MODES, "sr8", "sr3", "sr32")
PRESET_NAMES = (
    "fp64",
    "fp32",
    "tf32",
    "fp16",
    "bf16",
    "e4m3fn",
    "e5m2",
    "e4m3fnuz",
    "e5m2fnuz",
    "e3m2",
    "e2m3",
    "e2m1",
)
NARROW_SOURCES = {  # dtype, width in bits
    "fp16": (np.float16, 16),
    "bf16": (ml_dtypes.bfloat16, 16),
    "e4m3fn": (ml_dtypes.float8_e4m3fn, 8),
    "e5m2": (ml_dtypes.float8_e5m2, 8),
    "e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 8),
    "e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, 8),
    "e3m2": (ml_dtypes.float6_e3m2fn, 6),
    "e2m3": (ml_dtypes.float6_e2m3fn, 6),
    "e2m1": (ml_dtypes.float4_e2m1fn, 4),
}


def rounding_of(mode: str, seed: int = 12345):
    """emufloat rounding argument plus (srbits, srnumbits) for the oracle."""
    if mode.startswith("sr"):
        return ef.stochastic(bits=int(mode[2:]), seed=seed), int(mode[2:])
    return mode, 0


def cast_oracle(fmt, x, mode: str, rnd, r: int) -> np.ndarray:
    fi = gfloat_info(fmt)
    srbits = stochastic_bits(rnd, np.size(x)) if r else None
    return gf_round(
        fi,
        np.asarray(x, np.float64).ravel(),
        "sr" if r else mode,
        sat=fmt.overflow == "saturate",
        srbits=srbits,
        srnumbits=r,
    )


def check_cast(x, fmt, mode: str, ctx: str, seed: int = 12345) -> int:
    """encode() against gfloat bit for bit, and quantize() returns the same values; returns count."""
    rnd, r = rounding_of(mode, seed)
    fi = gfloat_info(fmt)
    want = cast_oracle(fmt, x, mode, rnd, r)
    bits = ef.encode(x, fmt, rnd)
    assert bits.dtype == fmt.uint and bits.shape == np.shape(x)
    got = gf_decode(fi, bits.ravel())
    assert_same(got, want, nan_sign=nan_has_sign(fi), ctx=f"{ctx} encode", x=np.ravel(x), bits=bits.ravel())
    q = ef.quantize(x, fmt, rnd)
    assert q.dtype == fmt.carrier
    assert_same(q.astype(np.float64).ravel(), want, nan_sign=nan_has_sign(fi), ctx=f"{ctx} quantize", x=np.ravel(x))
    # a trace sends every element through the general rounding routine instead of the fast path
    traced = ef.encode(x, fmt, rnd, trace=ef.Trace())
    assert_same(
        gf_decode(fi, traced.ravel()), want, nan_sign=nan_has_sign(fi), ctx=f"{ctx} traced encode", x=np.ravel(x)
    )
    return want.size


# ---- (a) float32 -> narrow formats, RNE, against ml_dtypes ---------------------------------------------------


def float32_boundaries(name: str) -> np.ndarray:
    """Every value of the format and every midpoint between neighbours, as float32 where exact,
    each with its float32 neighbours 1 and 2 ulps away, both signs.

    The midpoints include the one between 0 and the smallest subnormal (half of
    it) and the one between max and max + ulp(max) (the overflow threshold).
    """
    dt, width = NARROW_SOURCES[name]
    with np.errstate(over="ignore", invalid="ignore"):
        v = all_patterns(dt, width).astype(np.float64)
        v = np.unique(v[np.isfinite(v) & (v >= 0)])
        v = np.append(v, v[-1] + (v[-1] - v[-2]))  # the first value past max
        pts = np.concatenate([v, (v[:-1] + v[1:]) / 2])
        pts = pts[pts.astype(np.float32).astype(np.float64) == pts].astype(np.float32)
        up1 = np.nextafter(pts, np.float32(np.inf))
        up2 = np.nextafter(up1, np.float32(np.inf))
        dn1 = np.nextafter(pts, np.float32(0))
        dn2 = np.nextafter(dn1, np.float32(0))
    allp = np.concatenate([pts, up1, up2, dn1, dn2])
    return np.concatenate([allp, -allp])


def float32_specials() -> np.ndarray:
    bits = np.array(
        [
            0x00000000,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0xFFC00000,
            0x7F800001,
            0xFF800001,
            0x7FA00000,
            0x7FFFFFFF,
            0xFFFFFFFF,
            0x7FC00001,
            0x7F802000,
            0x7FE00000,
            0x7F7FFFFF,
            0xFF7FFFFF,
            0x00000001,
            0x80000001,
            0x00800000,
            0x80800000,
            0x007FFFFF,
            0x3F800000,
            0x3F800001,
        ],
        dtype=np.uint32,
    )
    return bits.view(np.float32)


def float32_sample(name: str, n_random: int = 1 << 21, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rand = rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([float32_specials(), float32_boundaries(name), rand])


@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"])
def test_float32_rne_matches_ml_dtypes(name):
    """Bit-identical to ml_dtypes (numpy for FP16); FP16 NaN payloads may differ, NaN-ness and sign may not."""
    x = float32_sample(name)
    dt = ML_DTYPE[name]
    uint = np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dt).view(uint)
    got = ef.encode(x, name)
    assert got.dtype == uint
    q = ef.quantize(x, name)
    assert q.dtype == np.dtype(dt)
    np.testing.assert_array_equal(q.view(uint), got)
    nan_in = np.isnan(x)
    if name == "fp16":  # numpy keeps NaN payload bits; emufloat gives the canonical quiet NaN
        gotv = got.view(np.float16)
        assert np.isnan(gotv[nan_in]).all()
        np.testing.assert_array_equal(np.signbit(gotv[nan_in]), np.signbit(x[nan_in]))
        assert (got[nan_in] & 0x7FFF == 0x7E00).all(), "canonical quiet NaN"
        bad = ~nan_in & (got != want)
    else:
        bad = got != want
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        raise AssertionError(
            f"{bad.sum()} mismatches; x={x[idx]!r} bits={x[idx].view(np.uint32)} got={got[idx]} want={want[idx]}"
        )
    # the sample really contains the edge cases it is meant to
    assert nan_in.sum() >= 10 and np.isinf(x).sum() >= 2


@pytest.mark.parametrize("name", ["e3m2", "e2m3", "e2m1"])
def test_float32_rne_matches_ml_dtypes_mx(name):
    """MX FP6/FP4 (no Inf/NaN; overflow and Inf saturate): agree with ml_dtypes on all non-NaN input."""
    x = float32_sample(name)
    x = x[~np.isnan(x)]
    dt = ML_DTYPE[name]
    want = x.astype(dt).view(np.uint8)
    got = ef.encode(x, name)
    bad = got != want
    assert not bad.any(), f"{bad.sum()} mismatches, e.g. x={x[bad][:8]!r} got={got[bad][:8]} want={want[bad][:8]}"


@pytest.mark.parametrize("name", ["e3m2", "e2m3", "e2m1"])
def test_nan_into_format_without_nan_raises(name):
    for f in (ef.encode, ef.quantize):
        with pytest.raises(ValueError):
            f(np.array([1.0, np.nan], np.float32), name)


# ---- (b) every narrow encoding into every preset, every mode, against gfloat --------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("src", list(NARROW_SOURCES))
def test_all_narrow_patterns_every_target(src, mode):
    """Every encoding of each narrow format into each of the 12 presets (itself included).

    The fnuz NaN (0x80) is left out here and tested in test_fnuz_nan_source (a known bug).
    """
    dt, width = NARROW_SOURCES[src]
    x = all_patterns(dt, width)
    if src.endswith("fnuz"):
        x = x[x.view(np.uint8) != 0x80]
    n = 0
    errors = []
    for i, tname in enumerate(PRESET_NAMES):
        fmt = ef.as_format(tname)
        xs = x if fmt.has_nan else x[~np.isnan(x.astype(np.float64))]
        try:
            n += check_cast(xs, fmt, mode, f"{src}->{tname} {mode}", seed=1000 + i)
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)
    assert n >= 12 * (2**width - 2) * 0.9


@pytest.mark.parametrize("src", ["e4m3fnuz", "e5m2fnuz"])
def test_fnuz_nan_source(src):
    """quantize(float8_e4m3fnuz NaN, 'bf16') must be NaN (regression: the fast path once read 0x80 as -0)."""
    x = np.array([0x80], np.uint8).view(NARROW_SOURCES[src][0])
    assert np.isnan(x.astype(np.float32)).all()  # ml_dtypes: 0x80 is NaN
    for tname in PRESET_NAMES:
        fmt = ef.as_format(tname)
        if fmt.has_nan:
            got = ef.quantize(x, fmt).astype(np.float64)
            assert np.isnan(got).all(), f"{src} NaN -> {tname} gave {got}"


@pytest.mark.parametrize("mode", ["rne", "rup", "rto", "sr8"])
def test_non_contiguous_inputs(mode):
    """Strided, reversed and transposed inputs: results (and SR's flat C-order indices) as for a copy."""
    rng = np.random.default_rng(2)
    base = rng.integers(0, 2**32, (64, 96), dtype=np.uint64).astype(np.uint32).view(np.float32)
    rnd, _ = rounding_of(mode, seed=9)
    for view in (base[::-2, 1::3], base.T, base[:, ::-1], np.asfortranarray(base)):
        got = ef.encode(view, "bf16", rnd)
        np.testing.assert_array_equal(got, ef.encode(np.ascontiguousarray(view), "bf16", rnd))
        assert got.shape == view.shape


def test_sr_statistics_follow_the_definition():
    """SR with r bits rounds up with probability floor(d*2**r)/2**r: a sanity check of the oracle's reading."""
    x = np.full(1 << 16, np.float32(1.0) + np.float32(0.3 * 2.0**-7))  # d = 0.3 ulp of bf16 at 1.0
    rnd = ef.stochastic(bits=3, seed=7)
    q = ef.quantize(x, "bf16", rnd).astype(np.float64)
    up = np.mean(q > 1.0)
    assert abs(up - 2 / 8) < 0.01  # floor(0.3 * 8) = 2
    r = stochastic_bits(rnd, x.size)
    np.testing.assert_array_equal(q > 1.0, r >= 6)


# ---- (c) float64 input into FP32 and BF16 ---------------------------------------------------------------------


def float64_sample(seed: int = 3) -> np.ndarray:
    """Random float64 bit patterns around the FP32 range, plus midpoints of FP32 and BF16 and their neighbours."""
    rng = np.random.default_rng(seed)
    n = 1 << 17
    sign = rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63)
    expo = rng.integers(1023 - 160, 1023 + 131, n).astype(np.uint64) << np.uint64(52)
    frac = rng.integers(0, 2**52, n, dtype=np.uint64)
    near = (sign | expo | frac).view(np.float64)
    anyb = rng.integers(0, 2**63, 1 << 14, dtype=np.uint64) * np.uint64(2) + rng.integers(
        0, 2, 1 << 14, dtype=np.uint64
    )
    anyv = anyb.view(np.float64)
    b = rng.integers(0, 0x7F800000, 1 << 15, dtype=np.uint64).astype(np.uint32)
    b = np.concatenate(
        [
            b,
            np.arange(64, dtype=np.uint32),
            0x7F7FFFFF - np.arange(64, dtype=np.uint32),
            0x007FFFE0 + np.arange(64, dtype=np.uint32),
        ]
    )
    v32 = b.view(np.float32)
    with np.errstate(over="ignore"):
        n32 = np.nextafter(v32, np.float32(np.inf)).astype(np.float64)
    n32[np.isinf(n32)] = 2.0**128
    vb = np.unique(all_patterns(ml_dtypes.bfloat16, 16).astype(np.float64))
    vb = np.append(vb[np.isfinite(vb) & (vb >= 0)], 2.0**128)
    mids = [(v32.astype(np.float64) + n32) / 2, (vb[:-1] + vb[1:]) / 2]
    mids.append(np.array([2.0**-150, 2.0**128 - 2.0**103, 2.0**-134, 2.0**128 - 2.0**119]))
    m = np.concatenate(mids)
    m = np.concatenate([m, np.nextafter(m, np.inf), np.nextafter(m, 0), np.nextafter(np.nextafter(m, np.inf), np.inf)])
    spec = np.array([0.0, np.inf, np.nan, 1e300, 1e-300, 5e-324, 2.0**-149, 2.0**-133, 3.4028235677973366e38])
    x = np.concatenate([near, anyv, m, spec])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("tname", ["fp32", "bf16", "tf32", "e4m3fn"])
def test_float64_input(tname, mode):
    x = float64_sample()
    n = check_cast(x, ef.as_format(tname), mode, f"f64->{tname} {mode}")
    assert n > 300_000


# ---- (d) custom formats ---------------------------------------------------------------------------------------

CUSTOM = [
    ef.Format(3, 4),
    ef.Format(5, 2, overflow="saturate"),
    ef.Format(4, 3, specials="fn", overflow="saturate"),
    ef.Format(4, 3, bias=11),
    ef.Format(3, 2, specials="fnuz"),
    ef.Format(4, 2, specials="none"),
    ef.Format(8, 4),
    ef.Format(5, 6, specials="fn"),
]
E2M0 = ef.Format(2, 0, specials="none")  # precision 1: values 0, 1, 2, 4; see test_precision_one_format


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("fmt", CUSTOM, ids=lambda f: f.name)
def test_custom_formats(fmt, mode):
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            all_patterns(np.float16, 16).astype(np.float32),
            all_patterns(ml_dtypes.bfloat16, 16).astype(np.float32),
            rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32),
        ]
    )
    if not fmt.has_nan:
        x = x[~np.isnan(x)]
    check_cast(x, fmt, mode, f"f32->{fmt.name} {mode}")


@pytest.mark.parametrize("mode", ALL_MODES)
def test_precision_one_format(mode):
    """Format(2, 0, specials='none') vs gfloat (P3109-style: 'even' is the encoding's last bit, the exponent's)."""
    x = np.concatenate(
        [all_patterns(np.float16, 16).astype(np.float32), np.array([3.0, -3.0, 1.5, 2.5, 6.0], np.float32)]
    )
    check_cast(x[~np.isnan(x)], E2M0, mode, f"f32->e2m0 {mode}")


def test_precision_one_ties_agree_across_paths():
    """Regression: with man_bits=0 'even' is the exponent field's last bit on every path."""
    x = np.array([3.0], np.float32)
    results = {
        "quantize": ef.quantize(x, E2M0),
        "quantize traced": ef.quantize(x, E2M0, trace=ef.Trace()),
        "add(2, 1)": ef.add(np.float32([2.0]), np.float32([1.0]), E2M0),
        "div(3, 1)": ef.div(x, np.float32([1.0]), E2M0),
    }
    assert {float(v[0]) for v in results.values()} == {2.0}, results


def test_ieee_format_without_fraction_bits_keeps_nan():
    """Format(4, 0) has no NaN encoding: it must be refused (or keep NaN), never encode NaN as +Inf."""
    try:
        f = ef.Format(4, 0)
    except ValueError:
        return  # rejecting the format is a fix too
    try:
        bits = ef.encode(np.array([np.nan], np.float32), f)
    except ValueError:
        return  # so is refusing NaN, as for formats without NaN
    assert np.isnan(ef.decode(bits, f)).all(), f"NaN encoded as {bits} = {ef.decode(bits, f)}"


@pytest.mark.parametrize("name", [n for n in PRESET_NAMES if n not in ("fp32", "fp64")])
def test_oracle_builder_matches_gfloat_presets(name):
    """The generic FormatInfo builder used for custom formats agrees with gfloat's presets."""
    fmt = ef.as_format(name)
    pre = gfloat_info(fmt)
    built = build_info(fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.specials)
    codes = np.arange(2**pre.k, dtype=np.int64)
    assert_same(gf_decode(built, codes), gf_decode(pre, codes), nan_sign=True, ctx=name)
    assert built.max == pre.max


def test_flush_to_zero_format():
    """Format(6, 9, subnormals=False): hand-derived. bias 31, emin -30, min_normal 2**-30."""
    f = ef.Format(6, 9, subnormals=False)
    assert f.min_normal == 2.0**-30 and f.min_subnormal == 2.0**-30
    mn = 2.0**-30
    for mode in ("rne", "rtz", "rup", "rdown", "rna", "rto"):
        x = np.array([mn, -mn, 1.5 * mn, 0.75 * mn, -0.75 * mn, 2.0**-31, 2.0**-40, -(2.0**-40), 0.0, 1.0])
        q = ef.quantize(x, f, mode).astype(np.float64)
        want = np.array([mn, -mn, 1.5 * mn, 0.0, -0.0, 0.0, 0.0, -0.0, 0.0, 1.0])
        assert_same(q, want, nan_sign=True, ctx=f"ftz {mode}", x=x)
    # subnormal encodings (exponent field 0, fraction != 0) read as zero of their sign
    bits = np.array([0x0001, 0x01FF, 0x8001, 0x0200], dtype=np.uint16)
    assert_same(ef.decode(bits, f), np.array([0.0, 0.0, -0.0, mn]), nan_sign=True, ctx="ftz decode")


# ---- (e) decode / encode round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in PRESET_NAMES if n not in ("fp32", "fp64")])
def test_decode_encode_round_trip_all_encodings(name):
    fmt = ef.as_format(name)
    fi = gfloat_info(fmt)
    codes = np.arange(2**fmt.width, dtype=np.int64).astype(fmt.uint)
    vals = ef.decode(codes, fmt)
    assert vals.dtype == np.float64
    assert_same(vals, gf_decode(fi, codes), nan_sign=False, ctx=f"{name} decode vs gfloat", code=codes)
    if fmt.dtype is not None:
        assert_same(vals, codes.view(fmt.dtype).astype(np.float64), nan_sign=False, ctx=f"{name} decode vs ml_dtypes")
    nan = np.isnan(vals)
    back = ef.encode(vals, fmt)
    np.testing.assert_array_equal(back[~nan], codes[~nan])
    # NaN encodings come back as the canonical NaN of their sign
    if nan.any():
        assert np.isnan(gf_decode(fi, back[nan])).all()
        if nan_has_sign(fi):
            sign = codes[nan] >> (fmt.width - 1)
            vals_signed = np.where(sign == 1, -np.nan, np.nan)
            back2 = ef.encode(vals_signed, fmt)
            np.testing.assert_array_equal(back2 >> (fmt.width - 1), sign)
    q = ef.quantize(vals[~nan], fmt)
    assert_same(q.astype(np.float64), vals[~nan], nan_sign=True, ctx=f"{name} quantize round trip")


def test_fp32_fp64_round_trip():
    rng = np.random.default_rng(11)
    b32 = np.concatenate(
        [rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32), float32_specials().view(np.uint32)]
    )
    v = ef.decode(b32, "fp32")
    assert_same(v, b32.view(np.float32).astype(np.float64), nan_sign=True, ctx="fp32 decode")
    nan = np.isnan(v)
    np.testing.assert_array_equal(ef.encode(v, "fp32")[~nan], b32[~nan])
    np.testing.assert_array_equal(ef.encode(b32.view(np.float32), "fp32")[~nan], b32[~nan])
    b64 = rng.integers(0, 2**63, 1 << 18, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    v64 = b64.view(np.float64)
    nan64 = np.isnan(v64)
    np.testing.assert_array_equal(ef.encode(v64, "fp64")[~nan64], b64[~nan64])
    assert_same(ef.decode(b64, "fp64"), v64, nan_sign=True, ctx="fp64 decode")


@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3fn", "e5m2"])
def test_float32_lane_every_exponent_and_boundary(name):
    """The float32 cast lane (RNE into bf16, fp16, e4m3fn, e5m2: `emufloat._narrow_rne.run_cast`) against ml_dtypes
    (numpy for FP16): every sign, exponent and top 7 fraction bits (all 2**16 high halves) with low halves at
    every rounding boundary of these formats (ties, one below and above them, with even and odd kept bits), in
    arrays big enough for the parallel kernel and small enough for the serial one, allocated and ``out=``."""
    low = np.array(
        [0, 1, 0x0FFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32
    )
    bits = ((np.arange(1 << 16, dtype=np.uint32)[:, None] << 16) | low).reshape(-1)
    x = bits.view(np.float32)
    dt = ML_DTYPE[name]
    uint = np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dt).view(uint)
    nan = np.isnan(x)
    n = x.size
    for lo, hi in ((0, n), (0, 1000), (n - 1000, n)):  # the parallel kernel, then the serial one at both ends
        part, ref, isnan = x[lo:hi], want[lo:hi], nan[lo:hi]
        got = ef.encode(part, name)
        buf = np.empty(part.shape, dt)
        assert ef.quantize(part, name, out=buf) is buf
        np.testing.assert_array_equal(buf.view(uint), got)
        if name == "fp16":  # numpy keeps NaN payloads; emufloat gives the canonical quiet NaN of the sign
            assert (got[isnan] & 0x7FFF == 0x7E00).all()
            np.testing.assert_array_equal(got[isnan] >> 15, part.view(np.uint32)[isnan] >> 31)
            np.testing.assert_array_equal(got[~isnan], ref[~isnan])
        else:
            np.testing.assert_array_equal(got, ref)


def test_float32_lane_out_sharing_the_input():
    """``out=`` viewing the input's own bytes: the result is the cast of the input as it was before the call."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(50_000).astype(np.float32)
    want = x.astype(ml_dtypes.bfloat16)
    out = x.view(ml_dtypes.bfloat16)[: x.size]  # the first half of x's bytes
    ef.quantize(x, "bf16", out=out)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
