"""flashsim forward (and backward) of one attention head under precision policies, beside a float64 numpy
reference measured in the same run.

    python -m benchmarks.bench_flashsim            # N = 1024, d = 64, best/median of 3
    python -m benchmarks.bench_flashsim --n 256 --repeat 2

Rows: every policy untraced; the H100 policies (triton_h100: our Triton kernel bit for bit; fa2: FA2's
order on H100 arithmetic) also traced (every rounding recorded); the backward. Ratio = numpy reference
time / flashsim time (below 1: flashsim slower). Results and how to read them: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import emufloat as ef
import flashsim as fs
from benchmarks.bench_emufloat import cpu_model, measure


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
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    q, k, v = (ef.quantize(rng.standard_normal((args.n, args.d)), "bf16").astype(np.float32) for _ in range(3))
    do = ef.quantize(rng.standard_normal((args.n, args.d)), "bf16").astype(np.float32)
    scale = 1 / np.sqrt(args.d)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    ref = measure([lambda: numpy_attention(q64, k64, v64, scale)], args.repeat)[0]

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
    print(f"# baseline: float64 numpy softmax attention (forward only), best {ref.best:.4f} s\n")
    print("| row | best s | median s | ratio (numpy / flashsim) |")
    print("|---|---:|---:|---:|")
    for name, fn in rows:
        t = measure([fn], args.repeat)[0]
        print(f"| {name} | {t.best:.3f} | {t.median:.3f} | {ref.best / t.best:.4f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
