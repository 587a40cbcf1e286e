"""Where the FP8 kernel's lean on dense rows came from: the same rows under the FP8 kernel's policy with the FP8
tensor cores' P V accumulation (13 significand bits, truncated), with the BF16 tensor cores' (25 bits) in its
place, and with P V promoted to FP32 every 32 keys (the kernel's default), standard and cast_sum softmax
(docs/fix.md, "The table").

    python -m studies.fp8_pv_accumulation [--rows 600]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emufloat.console import ArgumentParser
from flashsim.analysis.experiments import reference, row_errors, rows_in_format
from flashsim.analysis.families import get_family
from flashsim.console import UsageError, run_command
from gpu.policies import kernel_policy


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.fp8_pv_accumulation", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=600, help="dense rows, scale 1/sqrt(d) (default 600)")
    args = ap.parse_args(argv)

    def run() -> int:
        if args.rows < 2:
            raise UsageError(f"--rows: expected an integer >= 2, got {args.rows}")
        fp8, bf16 = kernel_policy("e4m3", 64, False, promote_pv=False), kernel_policy("bf16", 64, False)
        wide = dataclasses.replace(fp8, pv=dataclasses.replace(fp8.pv, model=bf16.pv.model))
        promoted = kernel_policy("e4m3", 64, False, promote_pv=True)
        rows = rows_in_format(get_family("dense").make(args.rows, seed=1, n_keys=128, d=64), "e4m3fn")
        ref = reference(rows)
        runs = (("FP8 wgmma accumulation", fp8), ("BF16 wgmma accumulation", wide), ("promoted every 32", promoted))
        for label, pol in runs:
            for name, e in row_errors(rows, pol, ["standard", "cast_sum"], ref=ref).items():
                n_bad = int(np.count_nonzero(~np.isfinite(e.o)))
                o = e.o[np.isfinite(e.o)]
                print(
                    f"{label:24s} {name:9s} mean O error {o.mean():+.2e} +- {o.std(ddof=1) / np.sqrt(o.size):.1e} "
                    f"(standard error; {n_bad} non-finite rows excluded)"
                )
        return 0

    return run_command("fp8_pv_accumulation", run)


if __name__ == "__main__":
    raise SystemExit(main())
