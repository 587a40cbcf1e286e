"""Trace the rounding of the Qiu & Yao worked example, three ways.

1. One exact sum rounded once to BF16 (the paper's model of the P·V product).
2. FP32 adds and then a BF16 cast: the carry appears on the add, the tie and sticky on the cast.
3. All six deterministic rounding modes on the same sum, to see which ones lean.

Run: python3 examples/trace_worked_example.py
"""

import numpy as np

import emufloat as ef

fp32_sum = np.float32(-4.703990459442139)
residual = np.float32(fp32_sum + np.float32(4.703125))
terms = np.float32([-2.40625, -2.296875, residual])


def flags(tr, k):
    return ef.Flag(int(tr.flags[k])).name or "exact"


tr = ef.Trace()
print("1. exact sum -> bf16:", ef.sum(terms, "bf16", trace=tr), "error", tr.error[0], flags(tr, 0))

tr = ef.Trace()
s = ef.add(terms[0], terms[1], "fp32", trace=tr, label="P1*V1 + P2*V2")
s = ef.add(s, terms[2], "fp32", trace=tr, label="+ small terms")
o = ef.quantize(s, "bf16", trace=tr, label="store O")
print("2. step by step:")
for k, (op, fmt, _mode, _shape, label) in enumerate(tr.calls):
    print(
        f"   {label:15s} {op:5s} -> {fmt}: exact {tr.exact[k]:.10g} rounded {tr.rounded[k]:.10g} "
        f"error {tr.error[k]:+.6g} {flags(tr, k)}"
    )

print("3. modes:")
for mode in ["rne", "rna", "rtz", "rup", "rdown", "rto"]:
    tr = ef.Trace()
    out = ef.sum(terms, "bf16", mode, trace=tr)
    print(f"   {mode:5s} {float(out):+.6f} error {tr.error[0]:+.6f} {flags(tr, 0)}")
