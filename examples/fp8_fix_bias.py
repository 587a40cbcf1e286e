"""Do the fixes remove a lean when P is FP8?  The bias experiment of `flashsim bias-rows` with K, V and P in e4m3.

The rows of `flashsim bias-rows` (2..8 scores exactly at the row max r ~ U(-4, 4), the others about
10..20 below, V in -[1, 2)), with K and V rounded to e4m3, run under the policy of our FP8 kernel
(`gpu.policies.kernel_policy('e4m3', 64, False)`: e4m3 tensor cores, P cast to e4m3, fp32 accumulators,
bit-exact to the H100, docs/crosscheck.md) and compared with FP64 attention on the same values.

Run: PYTHONPATH=. python3 examples/fp8_fix_bias.py [--rows 10000] [--max-shift 2,1,0.5]
(`--max-shift` adds the robust variant with smaller shift caps; 10^4 rows take minutes on two cores)
Results and why: docs/flashsim.md, "Bias on many rows".
"""

import argparse
import dataclasses

from flashsim.analysis import experiments as ex
from gpu.policies import kernel_policy, kernel_variant

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--rows", type=int, default=10000)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--max-shift", default="", help="comma-separated caps for extra robust variants")
args = ap.parse_args()

rows = ex.rows_in_format(ex.repeated_maxima_rows(args.rows, seed=args.seed), "e4m3fn")
variants = [kernel_variant(name, "e4m3") for name in ("standard", "stabilised", "robust")]
for cap in filter(None, args.max_shift.split(",")):
    variants.append(dataclasses.replace(variants[2], max_shift=float(cap), name=f"robust<={cap}"))
results = ex.bias_rows(rows, kernel_policy("e4m3", 64, False), variants)
print(ex.format_bias_table(results, f"{rows.description}; policy of the FP8 kernel"))
