"""Throughput of emufloat's hardware models against numpy in the same process.

Two tables, in the style of bench_emufloat.py (whose timing helpers this
imports): tensor-core matmul models in GFLOP/s (2 M N K flops per call)
against numpy's float32 matmul of the same shape, and elementwise function
models in ns/element against the numpy function on float32.  ratio =
baseline time / emufloat time (best of the repetitions): above 1 means
emufloat is faster.  "other load" is the CPU other processes used meanwhile
(see bench_emufloat.OtherLoad).  Each side of a row is timed in its own
block after a pause (see _measure_alone), not interleaved.

    python -m benchmarks.bench_models            # M = N = K = 512, n = 2**24, 5 repeats
    python -m benchmarks.bench_models --quick    # M = N = K = 128, n = 2**18, 3 repeats

Matmul inputs are standard normal draws rounded to the model's input format;
numpy multiplies the same values held as float32 (converted before timing;
numpy's BLAS uses its own threads).  The emulated calls are untraced, so
FusedBlock models take their integer fast path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numba
import numpy as np

import emufloat as ef
from benchmarks.bench_emufloat import OtherLoad, Timing, add_common_args, measure, print_footer, print_header
from emufloat.hw import h100


@dataclass
class Row:
    name: str
    fn: Callable[[], object]
    baseline_name: str
    baseline: Callable[[], object]
    work: float  # flops (matmul rows) or elements (function rows) per call


# ---- matmul rows: GFLOP/s -------------------------------------------------------------------
MATMUL_MODELS = [  # (row name, model, input dtype)
    ("H100 wgmma bf16 (h100_wgmma_bf16)", h100.WGMMA_BF16, ml_dtypes.bfloat16),
    ("H100 wgmma fp16 (h100_wgmma_fp16)", h100.WGMMA_FP16, np.float16),
    ("H100 wgmma fp8 e4m3fn (h100_wgmma_fp8)", h100.WGMMA_FP8, ml_dtypes.float8_e4m3fn),
]


def matmul_rows(size: int, seed: int) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for name, model, dtype in MATMUL_MODELS:
        a = rng.standard_normal((size, size), dtype=np.float32).astype(dtype)
        b = rng.standard_normal((size, size), dtype=np.float32).astype(dtype)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        rows.append(
            Row(
                f"{name} {size}x{size}x{size}",
                lambda a=a, b=b, m=model: ef.matmul(a, b, m),
                "numpy float32 a @ b",
                lambda a32=a32, b32=b32: a32 @ b32,
                2.0 * size**3,
            )
        )
    return rows


# ---- function model rows: ns/element against numpy on float32 --------------------------------
# (row name, model, baseline name, baseline): both called on one float32 array of --n elements
FUNCTION_MODELS: list[tuple[str, Callable[[np.ndarray], object], str, Callable[[np.ndarray], object]]] = [
    ("H100 tl.math.exp2 model (h100.triton_exp2)", h100.triton_exp2, "numpy np.exp2 float32", np.exp2),
    ("H100 tl.exp model (h100.triton_exp)", h100.triton_exp, "numpy np.exp float32", np.exp),
    ("correctly rounded exp2 (ef.exp2)", ef.exp2, "numpy np.exp2 float32", np.exp2),
    (
        "H100 fp32 division model (h100.triton_div)",
        lambda x: h100.triton_div(x, x + np.float32(1)),
        "numpy float32 division",
        lambda x: x / (x + np.float32(1)),
    ),
]


def function_rows(n: int, seed: int) -> list[Row]:
    if not FUNCTION_MODELS:
        return []
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32) * np.float32(8)  # within about +-40: finite exp2
    return [
        Row(name, lambda f=fn: f(x), baseline_name, lambda g=baseline: g(x), float(n))
        for name, fn, baseline_name, baseline in FUNCTION_MODELS
    ]


PAUSE = 0.5  # seconds between the two sides of a row: longer than OpenBLAS's and libgomp's idle spinning


def _measure_alone(fn: Callable[[], object], repeat: int) -> Timing:
    """bench_emufloat.measure of one callable, after a pause.

    Not interleaved with the baseline, unlike bench_emufloat: numpy's BLAS
    threads and Numba's OpenMP threads each spin for a while after a call,
    and on a 2-core machine the other side's calls then run many times slower
    (benchmarks/README.md).
    """
    time.sleep(PAUSE)
    return measure([fn], repeat)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_models", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=512, help="M = N = K of the matmul rows (default 512)")
    p.add_argument("--n", type=int, default=1 << 24, help="elements of the function rows (default 2**24)")
    add_common_args(p, "small run: size 128, n = 2**18, 3 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.n, args.repeat = 128, 1 << 18, 3
    if args.size < 1 or args.n < 1 or args.repeat < 1:
        p.error("--size, --n and --repeat must be positive")
    if args.threads is not None:
        numba.set_num_threads(args.threads)

    print_header("emufloat model benchmark")
    print(
        f"# best and median of {args.repeat} after one warm-up call each and {args.spin_up:g} s of spin-up; "
        "ratio = baseline time / emufloat time (best), above 1 = emufloat faster; "
        "other load = cores busy with other processes during the row"
    )

    tables = [
        ("matmul", matmul_rows(args.size, args.seed), "GFLOP/s", lambda t, w: w / t / 1e9),
        ("functions", function_rows(args.n, args.seed), "ns/elt", lambda t, w: t / w * 1e9),
    ]
    tables = [(title, [r for r in rows if args.only in r.name], unit, rate) for title, rows, unit, rate in tables]
    if not any(rows for _t, rows, _u, _r in tables):
        p.error(f"--only {args.only!r} matches no row")
    all_rows = [r for _t, rows, _u, _r in tables for r in rows]
    for row in all_rows:  # compile or load every kernel first
        row.fn()
    t_end = time.perf_counter() + args.spin_up  # see bench_emufloat: the first second of parallel work is slow
    while time.perf_counter() < t_end:
        all_rows[0].fn()
    for title, rows, unit, rate in tables:
        if not rows:
            continue
        print()
        print(f"## {title}")
        print()
        print(f"| row | {unit} best | {unit} median | baseline | baseline {unit} | ratio | other load |")
        print("|---|---:|---:|---|---:|---:|---:|")
        for row in rows:
            with OtherLoad() as other:
                t, tb = (_measure_alone(fn, args.repeat) for fn in (row.fn, row.baseline))
            load_s = "" if other.cores is None else f"{other.cores:.2f}"
            print(
                f"| {row.name} | {rate(t.best, row.work):.2f} | {rate(t.median, row.work):.2f} | "
                f"{row.baseline_name} | {rate(tb.best, row.work):.2f} | {tb.best / t.best:.4f}x | {load_s} |",
                flush=True,
            )
    print_footer()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
