"""A format of your own, as one value: FP8 E3M4 (3 exponent bits, 4 fraction bits, IEEE infinities and NaN).

A `Format` is its defining fields; everything else (max, epsilon, the smallest subnormal) is derived.  Used
as a value it needs no registering; `register_format` makes its names usable wherever users type a format
(the API, sweep specs, the command line).  Run: python -m examples.extend.format
"""

import dataclasses

import numpy as np

import emufloat as ef
import flashsim as fs
from emufloat.formats import register_format
from flashsim.specs import Dot, Op

E3M4 = register_format(ef.Format(exp_bits=3, man_bits=4, name="e3m4"), "fp8_e3m4")

if __name__ == "__main__":
    print(E3M4)
    x = [0.1, 1 + 2**-5, 15.5, 16.0, -3e-3]
    print(f"{x} -> {ef.quantize(x, 'fp8_e3m4').tolist()} (nearest, ties to even; above max: inf)")
    print(f"{x} -> {ef.quantize(x, E3M4, 'rtz').tolist()} (toward zero: max)")
    values = ef.decode(np.arange(256, dtype=np.uint8), E3M4)
    kinds = {"finite": np.isfinite(values).sum(), "infinite": np.isinf(values).sum(), "NaN": np.isnan(values).sum()}
    print("encodings:", ", ".join(f"{n} {kind}" for kind, n in kinds.items()))

    # attention with P rounded to E3M4 before P V, every sum in FP32: a policy is values too
    pol = dataclasses.replace(
        fs.get_policy("baseline_bf16"),
        name="p_in_e3m4",
        p_cast=Op(E3M4),
        pv=Dot(E3M4, ef.Sequential(ef.FP32), into_acc=True),
    )
    rng = np.random.default_rng(0)
    q, k, v = (ef.quantize(rng.standard_normal((64, 32)), "bf16") for _ in range(3))
    got = fs.flash_forward(q, k, v, pol).o.astype(np.float64)
    exact = fs.reference_attention(q, k, v, "fp64").o
    print(f"attention with P in E3M4: largest |O - exact| = {np.max(np.abs(got - exact)):.3g}")
