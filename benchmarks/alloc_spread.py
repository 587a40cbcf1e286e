"""How much an emufloat kernel's speed depends on where its arrays happen to lie in memory.

On the 2-core development VM a bf16 add of 2**24 elements runs at either about 8 or about 20 ns per
element, depending only on the allocation (the same compiled kernel, the same values): one row of
bench_emufloat.py can land in either mode.  This prints, for several fresh allocations of the same inputs,
the best of three timed calls of each, so two versions can be compared by their modes.

    PYTHONPATH=. python benchmarks/alloc_spread.py [--n 16777216] [--trials 8] [--op add]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench_emufloat import measure  # noqa: E402  (this folder is on sys.path when run as a script)

import emufloat as ef  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 24, help="elements (default 2**24)")
    p.add_argument("--trials", type=int, default=8, help="fresh allocations (default 8)")
    p.add_argument("--op", choices=("add", "mul", "quantize"), default="add")
    args = p.parse_args(argv)
    if args.n < 1 or args.trials < 1:
        p.error("--n and --trials must be positive")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.n).astype(np.float32)
    y = rng.standard_normal(args.n).astype(np.float32)
    keep = []  # earlier trials' inputs stay alive, so every trial allocates afresh
    times = []
    for _ in range(args.trials):
        a, b = x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16)
        keep.append((a, b))
        call = {"add": lambda a=a, b=b: ef.add(a, b), "mul": lambda a=a, b=b: ef.mul(a, b),
                "quantize": lambda: ef.quantize(x.copy(), "bf16")}[args.op]
        times.append(measure([call], 3)[0].best / args.n * 1e9)
    print(f"# {args.op}, n = {args.n}, ns/element per fresh allocation (best of 3):")
    print(" ".join(f"{t:.2f}" for t in times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
