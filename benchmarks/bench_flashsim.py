"""flashsim forward (and backward) of one attention head under precision policies, beside a float64 numpy
reference measured in the same run.

    python -m benchmarks.bench_flashsim            # N = 1024, d = 64, best/median of 3
    python -m benchmarks.bench_flashsim --n 256 --repeat 2 --bias-rows 500
    python -m benchmarks.bench_flashsim --profile   # where triton_h100's forward spends its time, and exit

Rows: every policy untraced; the H100 policies (triton_h100: our Triton kernel bit for bit; fa2: FA2's
order on H100 arithmetic) also traced (every rounding recorded); the backward. Ratio = numpy reference
time / flashsim time (below 1: flashsim slower), against float64 and float32 numpy attention of the same size.
Then the bias rows that hunts, sweeps and `flashsim bias-rows` run (one query a head, 128 keys, d = 64):
their heads at once, as `flash_forward` runs them, against one call a head, in cell-rows a second.
`--profile` prints instead a cProfile of the `triton_h100` forward on one Numba thread (the functions with the
most time of their own, per call of flash_forward).  Results and how to read them: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

import emufloat as ef
import flashsim as fs
from benchmarks.bench_emufloat import cpu_model, measure
from flashsim.analysis.families import get_family


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s = (q @ k.T) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_flashsim", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bias-rows", type=int, default=2000, help="rows of the bias-row section (0: skip it)")
    ap.add_argument("--profile", action="store_true", help="profile the triton_h100 forward instead")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    q, k, v = (ef.quantize(rng.standard_normal((args.n, args.d)), "bf16").astype(np.float32) for _ in range(3))
    if args.profile:
        profile_forward(q, k, v, args.repeat)
        return 0
    do = ef.quantize(rng.standard_normal((args.n, args.d)), "bf16").astype(np.float32)
    scale = 1 / np.sqrt(args.d)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    ref, ref32 = measure(
        [lambda: numpy_attention(q64, k64, v64, scale), lambda: numpy_attention(q, k, v, np.float32(scale))],
        args.repeat,
    )

    rows = []
    for pol in ("fp64", "fp32", "baseline_bf16", "qiu_yao", "triton_h100", "fa2"):
        rows.append((f"forward {pol}", lambda p=pol: fs.flash_forward(q, k, v, p)))
    for pol in ("triton_h100", "fa2"):
        rows.append((f"forward {pol}, traced", lambda p=pol: fs.flash_forward(q, k, v, p, trace=ef.Trace())))
    rows.append(("forward qiu_yao, stabilised", lambda: fs.flash_forward(q, k, v, "qiu_yao", softmax="stabilised")))
    rows.append(("forward triton_h100, robust", lambda: fs.flash_forward(q, k, v, "triton_h100", softmax="robust")))
    fwd = {pol: fs.flash_forward(q, k, v, pol) for pol in ("fp64", "triton_h100", "fa2")}
    for pol in ("fp64", "triton_h100", "fa2"):
        o, lse = fwd[pol].o, fwd[pol].lse
        rows.append((f"backward {pol}", lambda p=pol, o=o, lse=lse: fs.flash_backward(q, k, v, o, lse, do, p)))

    print(f"# flashsim benchmark, one head N={args.n}, d={args.d}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"# cpu: {cpu_model()}; best and median of {args.repeat} after a warm-up call")
    print(
        f"# baselines: numpy softmax attention (forward only), float64 best {ref.best:.4f} s, "
        f"float32 {ref32.best:.4f} s\n"
    )
    print("| row | best s | median s | ratio (numpy f64 / flashsim) | ratio (numpy f32 / flashsim) |")
    print("|---|---:|---:|---:|---:|")
    for name, fn in rows:
        t = measure([fn], args.repeat)[0]
        print(
            f"| {name} | {t.best:.3f} | {t.median:.3f} | {ref.best / t.best:.4f}x | {ref32.best / t.best:.4f}x |",
            flush=True,
        )
    if args.bias_rows:
        bias_rows(args.bias_rows, args.repeat)
    return 0


def profile_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, calls: int, top: int = 8) -> None:
    """The functions with the most time of their own in ``calls`` triton_h100 forwards on one Numba thread (so
    that kernel time is CPU time), per forward, beside the unprofiled wall time of one."""
    import numba

    numba.set_num_threads(1)
    fs.flash_forward(q, k, v, "triton_h100")
    t0 = time.perf_counter()
    for _ in range(calls):
        fs.flash_forward(q, k, v, "triton_h100")
    wall = (time.perf_counter() - t0) / calls
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fs.flash_forward(q, k, v, "triton_h100")
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own time, cumulative, ...)
    rows = sorted(((own, n, f"{f.rsplit('/', 2)[-1]}:{name}") for (f, _l, name), (n, _p, own, *_r) in stats.items()))
    print(f"# triton_h100 forward, one head N={q.shape[0]}, d={q.shape[1]}, one Numba thread, {calls} calls")
    print(f"# cpu: {cpu_model()}; unprofiled {wall * 1e3:.0f} ms a call\n")
    print("| function (own time) | calls a forward | ms a forward |")
    print("|---|---:|---:|")
    for own, n, name in reversed(rows[-top:]):
        print(f"| {name} | {n / calls:.0f} | {own / calls * 1e3:.1f} |")


def bias_rows(n_rows: int, repeat: int) -> None:
    """O of ``n_rows`` bias rows (the ties family) per policy: all heads in one call, and one call a head."""
    rows = get_family("ties").make(n_rows, seed=1, n_keys=128, d=64)
    print(f"\n# bias rows: {n_rows} rows of the ties family, one query a head, 128 keys, d = 64, best of {repeat}\n")
    print("| policy | heads at once, cell-rows/s | one call a head, cell-rows/s | ratio |")
    print("|---|---:|---:|---:|")
    for pol in ("triton_h100", "qiu_yao", "fa2"):
        at_once, one_by_one = measure(
            [
                lambda p=pol: fs.flash_forward(rows.q, rows.k, rows.v, p, sm_scale=1.0),
                lambda p=pol: [
                    fs.flash_forward(rows.q[i], rows.k[i], rows.v[i], p, sm_scale=1.0) for i in range(n_rows)
                ],
            ],
            repeat,
        )
        fast, slow = n_rows / at_once.best, n_rows / one_by_one.best
        print(f"| {pol} | {fast:,.0f} | {slow:,.0f} | {fast / slow:.1f}x |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
