"""emufloat add/sub/mul/div/fma/sqrt on >= 10**7 BF16 and >= 10**7 FP32 operand sets, against SoftFloat.

Usage:
    python -m tools.check_ops_random [--per-combo 280000] [--chunk 35000] [--workers 2]
                                                  [--formats bf16,fp32] [--ops add,...] [--modes rne,...]
    (--formats may also name fp16: its operand sets are rounded by gfloat from the exact results, as bf16's; and
    bf16xf32: fma only, bf16 * bf16 + f32 -> f32, the mixed fma of a bf16 product into an f32 accumulator)

Operands come from tools/hardcases.py (weighted to carries, exact ties,
cancellation, exponent gaps, subnormals, overflow and specials; fma's third
operand drawn the same way, including c = -(a*b) + a few ulps).  Every
(format, op, mode) combination gets `--per-combo` fresh operand sets, so the
default 6 ops x 6 deterministic modes x 280,000 = 10,080,000 per format.

Oracles:
* FP32: Berkeley SoftFloat f32_{add,sub,mul,div,mulAdd,sqrt} in the same mode;
  round-to-odd = SoftFloat toward zero with the last bit jammed when inexact.
  In RNE, numpy float32 is checked as well for add/sub/mul/div/sqrt.
* BF16: SoftFloat binary64 round-to-odd of the exact result, then gfloat into
  BF16 in the mode (exact double rounding, see tools/oracles.py).
* bf16xf32: SoftFloat f32_mulAdd of the operands widened to f32 (exactly) in the same mode; c is an FP32 hard case
  or -(a*b) moved by a few ulps (cancellation).

Work is spread over processes (one per core, one Numba thread each).  Prints
a table (op, mode, format, oracle, pairs, mismatches) and the total time; exit
status 1 on any mismatch.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # processes, not threads, share the cores

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np

from tools.hardcases import CATEGORIES, hard_operands
from tools.oracles import ARITY, MODES, gfloat_info, mismatch, op_oracle, rto64, sf_apply, sf_rto

OPS = ("add", "sub", "mul", "div", "fma", "sqrt")
MIXED = "bf16xf32"  # fma only: bf16 * bf16 + f32 -> f32
FORMATS = ("bf16", "fp32", "fp16", MIXED)


def mixed_operands(n: int, seed: int) -> dict[str, np.ndarray]:
    """bf16 hard cases a, b and an FP32 c: an FP32 hard case or -(a*b) moved by -3..3 ulps (cancellation)."""
    d = hard_operands("fma", "bf16", n, seed)
    rng = np.random.default_rng(seed)
    c_hard = hard_operands("fma", "fp32", n, seed + 1)["c"]
    with np.errstate(all="ignore"):
        prod = d["a"].astype(np.float32) * d["b"].astype(np.float32)
        step = rng.integers(-3, 4, n).astype(np.float32) * np.spacing(np.abs(prod)).astype(np.float32)
        c_cancel = -(prod + step)
    return d | {"c": np.where(rng.random(n) < 0.5, c_hard, c_cancel).astype(np.float32)}


def run_task(task: tuple) -> tuple:
    """One chunk of one (format, op, mode): returns counts and a few offending rows."""
    import emufloat as ef

    fmt, op, mode, n, seed, self_test = task
    d = mixed_operands(n, seed) if fmt == MIXED else hard_operands(op, fmt, n, seed)
    cols = [d[k] for k in "abc"[: ARITY[op]]]
    fn = {"add": ef.add, "sub": ef.sub, "mul": ef.mul, "div": ef.div, "fma": ef.fma, "sqrt": ef.sqrt}[op]
    # --self-test asks emufloat for the neighbouring mode, to show that the check can fail
    ef_mode = MODES[(MODES.index(mode) + 1) % len(MODES)] if self_test else mode
    if fmt == MIXED:
        got = np.asarray(ef.fma(*cols, "fp32", rounding=ef_mode)).astype(np.float64)
    else:
        got = np.asarray(fn(*cols, rounding=ef_mode)).astype(np.float64)
    if fmt in ("fp32", MIXED):
        wide = [c.astype(np.float32) for c in cols]  # bf16 -> f32 is exact
        want = sf_rto(op, 32, *wide) if mode == "rto" else sf_apply(op, 32, mode, *wide)[0]
    else:
        want = op_oracle(gfloat_info(ef.as_format(fmt)), mode, rto64(op, *cols))
    bad = mismatch(got, want, nan_sign=False)
    n_np = 0
    if fmt == "fp32" and mode == "rne" and op != "fma":
        a = cols[0]
        with np.errstate(all="ignore"):
            ref = {
                "add": lambda: a + cols[1],
                "sub": lambda: a - cols[1],
                "mul": lambda: a * cols[1],
                "div": lambda: a / cols[1],
                "sqrt": lambda: np.sqrt(a),
            }[op]().astype(np.float64)
        bad_np = mismatch(got, ref, nan_sign=False)
        n_np = int(bad_np.sum())
        bad |= bad_np
    rows = []
    for i in np.flatnonzero(bad)[:3]:
        ops_txt = ", ".join(f"{float(c[i]).hex()}" for c in cols)
        rows.append(
            f"{fmt} {op} {mode} [{CATEGORIES[d['cat'][i]]}] ({ops_txt}) -> emufloat "
            f"{float(got[i]).hex()}, oracle {float(want[i]).hex()}"
        )
    nan_results = int(np.isnan(want).sum())
    return fmt, op, mode, n, int(bad.sum()), n_np, nan_results, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-combo", type=int, default=280_000, help="operand sets per (format, op, mode)")
    ap.add_argument("--chunk", type=int, default=35_000, help="operand sets per task")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--formats", default="bf16,fp32", help=f"some of {','.join(FORMATS)}")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument(
        "--self-test",
        action="store_true",
        help="run emufloat in the next mode of the list (rne->rna, ..., rto->rne): must report mismatches",
    )
    args = ap.parse_args(argv)
    formats = args.formats.split(",")
    ops = args.ops.split(",")
    modes = args.modes.split(",")
    assert set(formats) <= set(FORMATS) and set(ops) <= set(OPS) and set(modes) <= set(MODES)

    tasks = []
    for fmt in formats:
        for op in ops:
            if fmt == MIXED and op != "fma":
                continue
            for mode in modes:
                done = 0
                k = 0
                while done < args.per_combo:
                    n = min(args.chunk, args.per_combo - done)
                    seed = (
                        args.seed
                        + 1_000_000 * FORMATS.index(fmt)
                        + 10_000 * OPS.index(op)
                        + 1000 * MODES.index(mode)
                        + k
                    )
                    tasks.append((fmt, op, mode, n, seed, args.self_test))
                    done += n
                    k += 1
    from tools.check_casts_exhaustive import header

    print(header())
    print(
        f"{len(tasks)} tasks on {args.workers} processes; {args.per_combo} operand sets per (format, op, mode)",
        flush=True,
    )
    t0 = time.perf_counter()
    results: dict[tuple[str, str, str], list[int]] = {}
    examples: list[str] = []
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        for j, (fmt, op, mode, n, nbad, nnp, nnan, rows) in enumerate(pool.imap_unordered(run_task, tasks)):
            acc = results.setdefault((fmt, op, mode), [0, 0, 0, 0])
            acc[0] += n
            acc[1] += nbad
            acc[2] += nnp
            acc[3] += nnan
            examples.extend(rows[: max(0, 30 - len(examples))])
            if j % 50 == 49:
                print(f"  {j + 1}/{len(tasks)} tasks, {time.perf_counter() - t0:.0f} s", flush=True)
    elapsed = time.perf_counter() - t0
    print()
    print("| op | mode | format | oracle | pairs | NaN results | mismatches |")
    print("|---|---|---|---|---|---|---|")
    totals: dict[str, int] = {}
    for fmt in formats:
        for op in ops:
            if (fmt, op, modes[0]) not in results:
                continue
            for mode in modes:
                n, nbad, nnp, nnan = results[(fmt, op, mode)]
                oracle = (
                    "SoftFloat f32" + (" (jam: RTO)" if mode == "rto" else "")
                    if fmt in ("fp32", MIXED)
                    else "SoftFloat f64 RTO + gfloat"
                )
                if nnp or (fmt == "fp32" and mode == "rne" and op != "fma"):
                    oracle += " + numpy"
                print(f"| {op} | {mode} | {fmt} | {oracle} | {n} | {nnan} | {nbad} |")
                totals[fmt] = totals.get(fmt, 0) + n
    for fmt, n in totals.items():
        print(f"{fmt}: {n} operand sets in total")
    nbad_all = sum(v[1] for v in results.values())
    print(f"total mismatches: {nbad_all}; total time {elapsed:.0f} s")
    for e in examples:
        print("MISMATCH", e)
    return 1 if nbad_all else 0


if __name__ == "__main__":
    sys.exit(main())
