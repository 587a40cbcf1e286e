"""Forward and backward TFLOP/s of our Triton attention (fix off, fix on) beside every SDPA backend, one run.

    python -m benchmarks.bench_gpu [--n 1024,4096,16384] [--d 64,128] [--rounds 2] [--json FILE]

B=4, H=32, bf16, causal and not; `triton.testing.do_bench` (25 ms warm-up, 100 ms of repeats, median),
the best of `--rounds` (2) rounds over all implementations of a shape.
Rows: ours standard / stabilised (Qiu & Yao) / robust / cast_sum (`flash.attention`: the forward kernel "auto"
picks, gpu.configs.OVERLAP_FROM_KEYS); SDPA cuDNN, flash, efficient; the tl forward kernel alone (`tl_*`, same
bits); our FP8 E4M3 forward (O in bf16): `fp8_standard` (the standard softmax, the FP8 tensor cores' own
accumulation: the fast one) and `fp8_default` (cast_sum with P V promoted to FP32: the accurate one,
docs/fix.md). Ratios in the same run: fix on against SDPA flash and cuDNN,
and the cost of each fix against our kernel without it (from unpaired timings, so it moves by several points
between passes: benchmarks/fix_cost.py measures it by paired launches). Needs a CUDA GPU (torch, Triton); on
the lent H100:
`python -m benchmarks.bench_gpu --json $OUT/bench.json --seconds 480`.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch

from gpu import flash
from studies.device.run_attention import bench_one, env, env_line, fwd_flops, rand, run_sdpa, sdpa_backends

B, H = 4, 32


def measure(d: int, n: int, causal: bool, fp8: bool = True, rounds: int = 2) -> dict:
    """TFLOP/s (forward, backward) of every implementation on one shape, the best of `rounds` rounds over
    all of them (a single pass at N=1024 put whichever implementation came first far too low: history/tried.md,
    "How the GPU numbers are measured");
    errors as strings."""
    q, k, v = rand((B, H, n, d), torch.bfloat16)
    do = torch.randn_like(q)
    flops = fwd_flops(B, H, n, d, causal)
    runs: dict = {}  # name -> (forward callable, backward callable or None)
    for sm in flash.SOFTMAX_IDS:
        runs[f"ours_{sm}"] = _with_backward(flash.attention, q, k, v, do, causal=causal, softmax=sm)
    for name, be in sdpa_backends().items():
        runs[f"sdpa_{name}"] = _with_backward(run_sdpa, q, k, v, do, backend=be, causal=causal)
    for sm in flash.SOFTMAX_IDS:  # the tl forward kernel, for comparison where "auto" takes the overlap one
        runs[f"tl_{sm}"] = (partial(flash.forward, q, k, v, causal=causal, softmax=sm, kernel="triton"), None)
    if fp8:
        q8, k8, v8 = (x.to(flash.FP8) for x in (q, k, v))
        fast = partial(flash.forward, q8, k8, v8, causal=causal, softmax="standard", promote_pv=False)
        runs["ours_fp8_standard"] = (fast, None)
        runs["ours_fp8_default"] = (partial(flash.forward, q8, k8, v8, causal=causal), None)
    out: dict = {"d": d, "n": n, "causal": causal}
    for _ in range(rounds):
        for name, (fwd, bwd) in runs.items():
            if isinstance(out.get(name), str):
                continue
            try:
                best = out.setdefault(name, {})
                best["fwd"] = max(best.get("fwd", 0.0), flops / bench_one(fwd) / 1e9)
                if bwd is not None:
                    best["bwd"] = max(best.get("bwd", 0.0), 2.5 * flops / bench_one(bwd) / 1e9)
            except Exception as exc:  # noqa: BLE001 - a backend may not support a shape
                out[name] = repr(exc)[:200]
    return out


def _with_backward(fn, q, k, v, do, **kw):
    """(forward call, backward call) of an autograd attention function on q, k, v."""
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    try:
        o = fn(qq, kk, vv, **kw)
    except Exception:  # noqa: BLE001 - the forward call reports it
        return partial(fn, q, k, v, **kw), None
    return partial(fn, q, k, v, **kw), partial(o.backward, do, retain_graph=True)


def _tf(row: dict, name: str, pass_: str) -> float | None:
    x = row.get(name)
    return x.get(pass_) if isinstance(x, dict) else None


def table(rows: list[dict]) -> str:
    """Markdown: TFLOP/s per implementation, the ratios of the fixes against SDPA flash and cuDNN, and each fix's
    cost against our kernel without it."""
    names = [
        "ours_standard",
        "ours_stabilised",
        "ours_robust",
        "ours_cast_sum",
        "sdpa_cudnn",
        "sdpa_flash",
        "sdpa_efficient",
        "tl_standard",
        "tl_stabilised",
        "tl_robust",
        "tl_cast_sum",
        "ours_fp8_standard",
        "ours_fp8_default",
    ]
    head = [
        "pass",
        "d",
        "N",
        "causal",
        *[n.replace("ours_", "").replace("sdpa_", "sdpa ") for n in names],
        "stab/flash",
        "stab/cuDNN",
        "robust/cuDNN",
        "stab cost",
        "robust cost",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(x):
        return "—" if x is None else f"{x:.0f}"

    def r(a, b):
        return "—" if a is None or b is None else f"{a / b:.2f}x"

    def cost(a, b):
        return "—" if a is None or b is None else f"{100 * (1 - a / b):+.1f}%"

    for pass_ in ("fwd", "bwd"):
        for row in rows:
            t = {n: _tf(row, n, pass_) for n in names}
            std, stab, rob = t["ours_standard"], t["ours_stabilised"], t["ours_robust"]
            lines.append(
                "| "
                + " | ".join(
                    [
                        pass_,
                        str(row["d"]),
                        str(row["n"]),
                        "yes" if row["causal"] else "no",
                        *[f(t[n]) for n in names],
                        r(stab, t["sdpa_flash"]),
                        r(stab, t["sdpa_cudnn"]),
                        r(rob, t["sdpa_cudnn"]),
                        cost(stab, std),
                        cost(rob, std),
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--json", metavar="FILE", help="also write the rows and the environment as JSON")
    ap.add_argument("--seconds", type=float, default=1e9, help="stop starting new shapes after this long")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all implementations per shape; best kept")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu: needs a CUDA GPU")
    t0 = time.time()
    rows = []
    for d in (int(x) for x in args.d.split(",")):
        for n in (int(x) for x in args.n.split(",")):
            for causal in (False, True):
                if time.time() - t0 > args.seconds:
                    break
                rows.append(measure(d, n, causal, rounds=args.rounds))
                print("measured", d, n, causal, flush=True)
    e = env()
    print(
        f"\n# bench_gpu: B={B} H={H} bf16, {env_line(e)}; TFLOP/s (backward: 2.5x forward FLOPs); "
        "cost = 1 - fix/standard (unpaired; benchmarks/fix_cost.py pairs them)\n"
    )
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": e, "bench": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
