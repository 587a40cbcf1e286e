"""CPU time per call of the attention kernels' Python entry points, against SDPA's, and whether it shows.

    python -m benchmarks.host_time [--d 64,128] [--n 1024] [--calls 100] [--profile]
        [--json FILE]

A launch that costs more CPU time than its kernel takes on the GPU leaves the GPU waiting: then the
Python call, not the kernel, sets the speed (small N, training loops that do not overlap host and device
work).  Host time is measured with the GPU kept busy by `torch.cuda._sleep` so no call waits for it:
`--calls` calls (an eighth of that where a call launches a backward too, so the launch queue never
fills) timed by `time.perf_counter`, the best of 7 batches, garbage collection off inside a batch.
Our rows are timed two ways, batch by batch interleaved: through `gpu.launch` (the compiled kernel
launched directly, the default) and through Triton's own `kernel[grid](...)` (inside `with
gpu.launch.direct(False):`), the baseline it replaces.  GPU time is one call replayed in a CUDA graph (no
host time inside), median of 20 replays; `host/GPU` above 1 means the row is host-bound when calls follow each other.
Rows: `gpu.flash.forward` (the kernel `auto` picks; both kernels at d=128), `gpu.flash.backward`
(three kernels), autograd forward + backward through `flash.attention`, and the same through
`torch.nn.functional.scaled_dot_product_attention` per backend.  `--profile` prints cProfile's top
functions (by own time) of 200 forward and backward calls per d (direct launches).
B=4, H=32, bf16, non-causal, the standard softmax (the fixes change the kernel, not the launch).  Needs a
CUDA GPU; on the lent H100: `python -m benchmarks.host_time --profile --json $OUT/host.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import pstats
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from gpu import flash, launch
from studies.device.run_attention import cuda_graph, env, env_line, rand, run_sdpa, sdpa_backends

B, H = 4, 32
SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU time at H100 clocks: longer than any batch of calls below


def host_us(fns: dict, calls: int, batches: int = 7) -> dict:
    """Microseconds of CPU time per call of each fns[name]() (a context, entered around a batch, and a
    callable), with the GPU busy so that no call waits for it: the best of `batches` batches, the entries
    interleaved batch by batch (garbage collection off inside a batch)."""
    best = {}
    for name, (context, fn) in fns.items():
        with context():
            fn()
        best[name] = float("inf")
    torch.cuda.synchronize()
    for _ in range(batches):
        for name, (context, fn) in fns.items():
            with context():
                torch.cuda._sleep(SLEEP_CYCLES)
                gc.disable()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t0) / calls)
                gc.enable()
            torch.cuda.synchronize()
    return {name: 1e6 * t for name, t in best.items()}


def gpu_us(fn, replays: int = 20) -> float:
    """Microseconds of GPU time per call of fn: one call captured in a CUDA graph, median of replays."""
    g = cuda_graph(fn)
    g.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 1e3 * statistics.median(times)


def rows_for(d: int, n: int) -> dict:
    """name -> callable, for one shape."""
    q, k, v = rand((B, H, n, d), torch.bfloat16)
    o, lse, _ = flash.forward(q, k, v)
    do = torch.randn_like(q)
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

    def ours_train():
        flash.attention(qg, kg, vg).backward(do)

    rows = {"flash.forward (auto)": lambda: flash.forward(q, k, v)}
    if d == 128:
        rows["flash.forward (overlap)"] = lambda: flash.forward(q, k, v, kernel="overlap")
        rows["flash.forward (triton)"] = lambda: flash.forward(q, k, v, kernel="triton")
    rows["flash.backward"] = lambda: flash.backward(q, k, v, o, lse, do)
    rows["flash.attention fwd+bwd"] = ours_train
    for name, backend in sdpa_backends().items():
        rows[f"sdpa {name} forward"] = partial(run_sdpa, q, k, v, backend=backend, causal=False)
        rows[f"sdpa {name} fwd+bwd"] = lambda backend=backend: run_sdpa(
            qg, kg, vg, backend=backend, causal=False
        ).backward(do)
    return rows


def profile(d: int, n: int, calls: int = 200) -> str:
    """cProfile's top 25 functions by own time over `calls` forward and backward calls."""
    q, k, v = rand((B, H, n, d), torch.bfloat16)
    o, lse, _ = flash.forward(q, k, v)
    do = torch.randn_like(q)
    flash.backward(q, k, v, o, lse, do)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        flash.forward(q, k, v)
        flash.backward(q, k, v, o, lse, do)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host_time", description=__doc__.split("\n")[0])
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--n", default="1024")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--profile", action="store_true", help="also: cProfile's top functions (per d, first N)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if a.calls < 1:
        ap.error(f"--calls: at least 1, got {a.calls}")
    ds, ns = [int(x) for x in a.d.split(",")], [int(x) for x in a.n.split(",")]
    for d in ds:
        if d not in flash.HEAD_DIMS:
            ap.error(f"--d: {d} is not one of {flash.HEAD_DIMS}")
    command = " ".join(["python -m benchmarks.host_time", *(sys.argv[1:] if argv is None else argv)])
    res = {"env": env(), "command": command, "calls": a.calls, "rows": []}
    print(
        f"# {env_line(res['env'])}; B={B} H={H} bf16, "
        f"non-causal; host: best of 7 batches of {a.calls} calls with the GPU busy; GPU: CUDA-graph replay"
    )
    print("| d | N | call | host us | host us, Triton's launch | GPU us | host/GPU | host vs SDPA cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    for d in ds:
        for n in ns:
            rows = rows_for(d, n)
            for name, fn in rows.items():
                try:
                    dev = gpu_us(fn)
                except RuntimeError as e:  # a backend that cannot be captured in a graph: report, go on
                    print(f"# {name}: no CUDA-graph timing ({str(e).splitlines()[0]})", flush=True)
                    dev = float("nan")
                # several launches a call: fewer calls a batch, so the launch queue (~1000) never fills
                calls = a.calls if "bwd" not in name else max(1, a.calls // 8)
                if name.startswith("flash"):
                    t = host_us(
                        {"direct": (partial(launch.direct, True), fn), "triton": (partial(launch.direct, False), fn)},
                        calls,
                    )
                else:
                    t = {"direct": host_us({name: (contextlib.nullcontext, fn)}, calls)[name], "triton": float("nan")}
                row = {
                    "d": d,
                    "n": n,
                    "call": name,
                    "host_us": t["direct"],
                    "host_us_triton_launch": t["triton"],
                    "gpu_us": dev,
                }
                res["rows"].append(row)
            sdpa = {r["call"]: r["host_us"] for r in res["rows"] if r["d"] == d and r["n"] == n}
            for row in res["rows"]:
                if row["d"] != d or row["n"] != n:
                    continue
                ref = sdpa["sdpa cudnn fwd+bwd" if "bwd" in row["call"] else "sdpa cudnn forward"]
                tri = (
                    ""
                    if row["host_us_triton_launch"] != row["host_us_triton_launch"]
                    else f"{row['host_us_triton_launch']:.1f}"
                )
                print(
                    f"| {d} | {n} | {row['call']} | {row['host_us']:.1f} | {tri} | {row['gpu_us']:.1f} | "
                    f"{row['host_us'] / row['gpu_us']:.2f} | {row['host_us'] / ref:.2f}x |",
                    flush=True,
                )
            del rows
            torch.cuda.empty_cache()
    if a.profile:
        res["profile"] = {d: profile(d, ns[0]) for d in ds}
        for d, text in res["profile"].items():
            print(f"# cProfile, d={d}, N={ns[0]}: 200 x (flash.forward + flash.backward)\n{text}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
