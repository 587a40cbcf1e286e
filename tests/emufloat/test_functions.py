"""emufloat.functions: correctly rounded exp2 against mpmath; emufloat.hw.h100's function models against recorded
GPU outputs."""

from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest

import emufloat as ef
from emufloat import functions as F
from emufloat.hw import h100
from flashsim.recording import Recording
from studies.probes import inputs as probe_inputs
from tools.oracles import gf_round, gfloat_info, round_fraction

H100 = Path(__file__).parents[1] / "data" / "h100"
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")


def _exp2_fraction(x: float) -> Fraction:
    with mpmath.workprec(240):
        man, exp = (mpmath.mpf(2) ** mpmath.mpf(x)).man_exp
    return Fraction(int(man)) * Fraction(2) ** int(exp)


def _inputs(rng) -> np.ndarray:
    parts = [
        rng.uniform(-155, 130, 1500),
        rng.standard_normal(500) * 2.0 ** rng.integers(-30, 0, 500),
        np.round(rng.uniform(-150, 128, 300)) + rng.choice([-1, 1], 300) * 2.0 ** -rng.integers(10, 23, 300),
        rng.uniform(-151, -124, 400),
        rng.uniform(126, 128.5, 200),
    ]
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.parametrize("fmt", [ef.FP32, ef.BF16, ef.FP16, ef.E4M3FN, ef.E5M2])
def test_exp2_is_correctly_rounded_against_mpmath(fmt):
    x = _inputs(np.random.default_rng(7))
    # the exact value rounded to odd in binary64, then rounded by gfloat: one correct rounding (p <= 51)
    rto = np.array([round_fraction(_exp2_fraction(float(v)), 53, -1022, 1023, "rto") for v in x])
    for mode in MODES:
        got = np.asarray(F.exp2(x, fmt, mode), dtype=np.float64)
        want = gf_round(gfloat_info(fmt), rto, mode, sat=fmt.overflow == "saturate")
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (mode, x[~same][:5], got[~same][:5], want[~same][:5])


def test_exp2_exact_powers_specials_and_flags():
    k = np.arange(-160, 131).astype(np.float32)
    got = F.exp2(k)
    with np.errstate(over="ignore"):
        want = (np.float32(2.0) ** k.astype(np.float64)).astype(np.float32)
    assert np.array_equal(got, want)  # 2**-150 is a tie: rounds to even (zero)
    sp = F.exp2(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32))
    assert np.isnan(sp[0]) and sp[1] == np.inf and sp[2] == 0 and not np.signbit(sp[2]) and sp[3] == sp[4] == 1
    t = ef.Trace()
    F.exp2(np.array([3.0, 0.5], np.float32), trace=t)
    assert list(t.op_names) == ["exp2", "exp2"]
    assert not t.has("inexact")[0] and t.has("inexact")[1]
    assert abs(float(t.exact_hi[1]) - 2**0.5) < 1e-15


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="x: float64 values must be exactly representable"):
        h100.ex2_approx(np.array([0.1]))
    with pytest.raises(TypeError, match="x: expected a floating-point array"):
        h100.triton_exp(np.arange(3))
    with pytest.raises(ValueError, match="rounding: exp2 supports"):
        F.exp2(np.float32(1.0), rounding=ef.stochastic(8, seed=1))
    with pytest.raises(ValueError, match="b:"):
        h100.div_full(np.float32(1.0), np.array([1e-50]))


def test_damaged_table_is_refused(tmp_path):
    arrays = h100.DATA.load("ex2")
    arrays["neg_delta"] = arrays["neg_delta"].copy()
    arrays["neg_delta"][12345] += 1
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    with pytest.raises(ValueError, match="SHA-256"):
        h100.ex2_tables(str(p))


def test_rebuilt_tables_are_cached_checked_and_replaced_when_damaged(tmp_path, monkeypatch):
    """emufloat.hw.calibration.rebuilt: built once and kept; a cached copy that fails its check is rebuilt and
    replaced; a cache that cannot be written is passed over."""
    from emufloat.hw import calibration

    monkeypatch.setenv("EMUFLOAT_CACHE_DIR", str(tmp_path / "cache"))
    builds = []
    good = np.arange(10, dtype=np.uint32)

    def build():
        builds.append(1)
        return good.copy()

    def check(t):
        if not np.array_equal(t, good):
            raise ValueError("bad table")

    for _ in range(2):
        assert np.array_equal(calibration.rebuilt("t", "k1", build, check), good)
    assert len(builds) == 1
    np.save(tmp_path / "cache" / "t_k1.npy", good + 1)  # damaged copy
    assert np.array_equal(calibration.rebuilt("t", "k1", build, check), good) and len(builds) == 2
    assert np.array_equal(np.load(tmp_path / "cache" / "t_k1.npy"), good)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("EMUFLOAT_CACHE_DIR", str(tmp_path / "file" / "sub"))  # not a folder: cannot write
    assert np.array_equal(calibration.rebuilt("t", "k1", build, check), good) and len(builds) == 3
    with pytest.raises(ValueError, match="bad table"):
        calibration.rebuilt("t", "k2", lambda: good + 1, check)


def test_ex2_grid_falls_back_to_the_reference_exp2(monkeypatch):
    """The tables are rebuilt from numpy's float64 exp2 when that passes the recorded checksums, and from
    emufloat's correctly rounded exp2 when it does not (a platform whose exp2 is off somewhere)."""
    from emufloat.hw.h100 import ex2 as ex2_module

    real = ex2_module._grid_exp2
    calls = []

    def grid(sign, reference=True):
        calls.append(reference)
        bits = real(sign, reference)
        return bits if reference else bits ^ np.uint32(1)  # a wrong numpy grid

    monkeypatch.setattr(ex2_module, "_grid_exp2", grid)
    tneg, tpos = ex2_module.ex2_tables.__wrapped__(str(h100.DATA.path_of("ex2")))  # not cached anywhere
    assert calls == [False, False, True, True]
    ref_neg, ref_pos = h100.ex2_tables()
    assert np.array_equal(tneg, ref_neg) and np.array_equal(tpos, ref_pos)


def test_ex2_model_reads_the_table_at_grid_points():
    tneg, tpos = h100.ex2_tables()
    k = np.arange(0, 1 << 23, 4100)  # multiples of 4: z + 3 below is exact in float32
    z = (k * 2.0**-23).astype(np.float32)
    assert np.array_equal(h100.ex2_approx(z), tpos[k])
    assert np.array_equal(h100.ex2_approx(-z), tneg[k])
    assert np.array_equal(h100.ex2_approx(z + 3), tpos[k] * 8)  # exact power-of-two scaling
    nan = h100.ex2_approx(np.array([np.nan, -np.nan], np.float32)).view(np.uint32)
    assert (nan == 0x7FFFFFFF).all()


# ---- recorded on the H100 ------------------------------------------------------------------------------
def _functions() -> tuple[Recording, dict[str, np.ndarray]]:
    """functions.json (the SHA-256 of the GPU's outputs) and its inputs, regenerated from its seed and checked."""
    rec = Recording.load(H100 / "functions.json")
    x = probe_inputs.functions_inputs(rec.meta["seed"])
    rec.verify_all(x)
    return rec, x


@pytest.mark.parametrize("name", ["exp2", "exp", "ex2_nonftz", "rcp"])
def test_unary_models_reproduce_recorded_gpu_outputs(name):
    rec, z = _functions()
    x = z["x"].view(np.float32)
    model = {
        "exp2": h100.triton_exp2,
        "exp": h100.triton_exp,
        "ex2_nonftz": lambda v: h100.ex2_approx(v, ftz=False),
        "rcp": h100.rcp_approx,
    }[name]
    got = model(x).view(np.uint32)
    assert x.size > 100_000
    rec.verify(f"{name}_out", got)


def test_division_model_reproduces_recorded_gpu_outputs():
    rec, z = _functions()
    got = h100.div_full(z["div_a"].view(np.float32), z["div_b"].view(np.float32)).view(np.uint32)
    assert got.size > 100_000
    rec.verify("div_out", got)
    # the first probe run's sample (populations of studies/probes/division.py, a/b through Triton's `/`): drawn on the
    # GPU, so its inputs are kept whole (division.npz), the outputs as digests (division.json)
    d = Recording.load(H100 / "division.json")
    a, b = d.kept["a"].view(np.float32), d.kept["b"].view(np.float32)
    got = h100.triton_div(a, b).view(np.uint32)
    d.verify("out_div", got)
    d.verify("out_asm_div_full", got)
    ieee = ef.div(a, b).view(np.uint32)
    assert np.count_nonzero(ieee != d.bits("out_div", got)) > 1000  # not correctly rounded: the model matters


def test_traces_record_the_hardware_error():
    t = ef.Trace()
    x = np.linspace(-10, 10, 1001).astype(np.float32)
    y = h100.triton_exp(x, trace=t)
    assert list(np.unique(t.op_names)) == ["exp2", "mul"]
    e = t.select(t.op_names == "exp2")
    assert np.array_equal(e["rounded"].astype(np.float32), y)
    err = e["rounded"] - e["exact_hi"] - e["exact_lo"]
    assert np.all(np.abs(err) <= 2 * np.spacing(np.abs(y)))  # within 2 ulp of exp2(z)
    t = ef.Trace()
    q = h100.div_full(np.float32(1.0), np.float32(3.0), trace=t)
    assert t.op_names[0] == "div" and float(t.exact_hi[0]) == pytest.approx(1 / 3, rel=1e-15)
    assert q.dtype == np.float32


def test_model_traces_flag_exact_infinite_and_nan_results_as_exact():
    """ex2.approx(+-inf) and div.full(x, 0) are exact (+inf, +0, +-inf), a NaN result of a NaN input is no
    rounding: no INEXACT, as the correctly rounded references flag them; finite inexact results keep it."""
    z = np.array([np.inf, -np.inf, np.nan, 0.0, 0.5, 200.0], np.float32)
    t, ref = ef.Trace(), ef.Trace()
    with np.errstate(all="raise"):  # and no RuntimeWarning from inf - inf
        h100.ex2_approx(z, trace=t)
    ef.exp2(z, "fp32", trace=ref)
    inexact = (t.chunks[0].flags & ef.Flag.INEXACT) != 0
    assert inexact.tolist() == [False, False, False, False, True, True]
    assert inexact.tolist() == ((ref.chunks[0].flags & ef.Flag.INEXACT) != 0).tolist()
    t = ef.Trace()
    h100.div_full(np.float32([1.0, -1.0, 1.0]), np.float32([0.0, 0.0, 3.0]), trace=t)
    assert ((t.chunks[0].flags & ef.Flag.INEXACT) != 0).tolist() == [False, False, True]
