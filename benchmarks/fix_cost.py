"""What each fix costs against the same forward kernel without it, from paired launches.

    python -m benchmarks.fix_cost [--d 64,128] [--n 1024,4096,16384] [--kernels overlap,triton]
        [--inputs randn] [--rounds 30] [--mode graph] [--layer] [--json FILE]

Why not bench_gpu's numbers: there each implementation gets its own do_bench rounds, and on the H100 the
standard softmax alone moved between such rounds by more than a fix costs, so one pass could put a fix's
cost almost anywhere (history/tried.md, "How the GPU numbers are measured").  Here a round runs standard,
stabilised, robust and cast_sum (the variants of `gpu.flash.SOFTMAX_IDS`) back to back (the order
rotated from round to round), each as one CUDA-graph replay of
enough forward launches to last ~3 ms (no host time inside), timed by its own CUDA events; neighbouring
replays see the same clocks and power state.  A round's cost is 1 - t_standard / t_fix; the table gives the
median over the rounds and the 10th-90th percentile range, so a reader sees both the cost and how sure it
is.  `--mode flush` keeps the pairing but times the way do_bench does: one eager launch per softmax and
round, each after zeroing a 256 MB buffer (L2 flushed, a gap between kernels), the flush outside the events.
`--layer` adds what the fix costs a training step: per (d, N), forward and backward of one causal pre-LN
transformer block (`studies.device.train_check.Block`: width H*d, MLP 4x, bf16 weights, attention by
`flash.attention`), paired rounds of one eager step per softmax; TFLOP/s count 72 C^2 per token for the
linear layers (forward and backward) plus 3.5x the attention forward.

B=4, H=32, bf16, softmax_scale 1/sqrt(d); `kernel` as in `gpu.flash.forward` (the overlap kernel
where it runs: BLOCK_N equal to the head dim, d=64 and 128; rows it refuses are printed with the reason).
Inputs: `randn` N(0, 1) (bench_gpu's), `repeated` (gpu/crosscheck/cases.py: every
row has repeated maxima, so the fixes change the shift).  Needs a CUDA GPU; on the lent H100:
`python -m benchmarks.fix_cost --json $OUT/fix_cost.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gpu import flash
from studies.device.run_attention import cuda_graph, env, env_line, fwd_flops, kind_inputs, rand

B, H = 4, 32
SOFTMAXES = tuple(flash.SOFTMAX_IDS)  # standard first: the costs are against it
TARGET_MS = 3.0


def paired_rounds(launch: dict, rounds: int, per_launch: int = 1, before=None) -> dict:
    """ms per call of each launch[key]() (which makes `per_launch` calls) in every round: the callables
    back to back, their order (the dict's) rotated from round to round, each timed by its own CUDA events
    (`before`, e.g. an L2 flush, runs outside them)."""
    keys = list(launch)
    events = []
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            if before is not None:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch[key]()
            end.record()
            events.append((r, key, start, end))
    torch.cuda.synchronize()
    ms = {key: [0.0] * rounds for key in keys}
    for r, key, start, end in events:
        ms[key][r] = start.elapsed_time(end) / per_launch
    return ms


def measure(q, k, v, causal: bool, kernel: str, rounds: int, mode: str = "graph") -> dict:
    """Per softmax: ms per forward in every round (paired rounds); `mode` as in the module docstring."""
    fns = {sm: (lambda sm=sm: flash.forward(q, k, v, causal=causal, softmax=sm, kernel=kernel)) for sm in SOFTMAXES}
    for fn in fns.values():  # compile, then estimate one launch's time
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fns["standard"]()
    torch.cuda.synchronize()
    if mode == "graph":
        reps = max(1, min(64, math.ceil(TARGET_MS / max(1e-3, 1e3 * (time.perf_counter() - t0)))))
        launch = {sm: cuda_graph(fn, reps).replay for sm, fn in fns.items()}
        before = None
    else:
        reps, launch = 1, fns
        before = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda").zero_  # do_bench's L2 flush
    for run in launch.values():  # one untimed run each: graph upload, clocks up
        run()
    return {"mode": mode, "reps": reps, "ms": paired_rounds(launch, rounds, reps, before)}


def measure_layer(d: int, n: int, rounds: int) -> tuple[dict, float]:
    """Per softmax: ms per training step (forward + backward) of one causal transformer block, paired
    rounds; and the step's FLOPs."""
    from studies.device.train_check import Block

    c = H * d
    blk = Block(c, H, "ours", "standard").cuda().to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((B, n, c), device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn((B, n, c), device="cuda", generator=g).to(torch.bfloat16)

    def step(sm: str) -> None:
        blk.softmax = sm
        blk(x).backward(dy)

    launch = {sm: (lambda sm=sm: step(sm)) for sm in SOFTMAXES}
    for run in launch.values():  # compile, warm up
        run()
    flops = B * n * 72.0 * c * c + 3.5 * fwd_flops(B, H, n, d, True)
    return {"mode": "eager", "reps": 1, "ms": paired_rounds(launch, rounds)}, flops


def paired_cost(reference: list[float], times: list[float]) -> dict:
    """What ``times`` cost over ``reference``, round by round (1 - t_reference / t, in %): the median and the
    10-90% range over the rounds."""
    costs = [100 * (1 - a / b) for a, b in zip(reference, times, strict=True)]
    p10, p90 = np.quantile(costs, [0.1, 0.9])
    return {"median": statistics.median(costs), "p10": float(p10), "p90": float(p90)}


def summarise(ms: dict, flops: float) -> dict:
    """Median TFLOP/s per softmax; per fix the median and 10-90% range of the rounds' paired costs (%)."""
    out = {"tflops": {sm: flops / statistics.median(t) / 1e9 for sm, t in ms.items()}}
    for sm in (x for x in ms if x != "standard"):
        out[f"{sm}_cost"] = paired_cost(ms["standard"], ms[sm])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fix_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--kernels", default="overlap,triton", help="of gpu.flash.KERNELS")
    ap.add_argument("--inputs", default="randn", help="randn, repeated")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument(
        "--mode",
        default="graph",
        choices=("graph", "flush"),
        help="graph: back-to-back CUDA-graph replays; flush: do_bench's regime, paired",
    )
    ap.add_argument("--layer", action="store_true", help="also: the cost per training step of a causal block")
    ap.add_argument("--json", help="write the rows (with every round's time) here")
    a = ap.parse_args(argv)
    kernels = a.kernels.split(",")
    for name in kernels:
        if name not in flash.KERNELS:
            ap.error(f"--kernels: {name!r} is not one of {flash.KERNELS}")
    kinds = a.inputs.split(",")
    for kind in kinds:
        if kind not in ("randn", "repeated"):
            ap.error(f"--inputs: {kind!r} is not one of randn, repeated")
    if a.rounds < 3:
        ap.error(f"--rounds: at least 3 (a rotation of the order), got {a.rounds}")
    command = " ".join(["python -m benchmarks.fix_cost", *(sys.argv[1:] if argv is None else argv)])
    res = {"env": env(), "command": command, "rounds": a.rounds, "rows": []}
    print(
        f"# {env_line(res['env'])}; B={B} H={H} bf16; "
        f"{a.rounds} paired rounds ({a.mode}); cost = 1 - t_standard / t_fix per round: median [10%, 90%]"
    )
    fixes = SOFTMAXES[1:]
    print(
        "| input | d | N | causal | kernel | "
        + " | ".join(SOFTMAXES)
        + " | "
        + " | ".join(f"{sm} cost" for sm in fixes)
        + " |"
    )
    print("|---" * (5 + len(SOFTMAXES) + len(fixes)) + "|")
    for kind in kinds:
        for d in map(int, a.d.split(",")):
            for n in map(int, a.n.split(",")):
                shape = (B, H, n, d)
                q, k, v = (
                    rand(shape, torch.bfloat16) if kind == "randn" else kind_inputs("repeated", "bf16", shape, 3)[:3]
                )
                for causal in (False, True):
                    for kernel in kernels:
                        row = {"input": kind, "d": d, "n": n, "causal": causal, "kernel": kernel}
                        try:
                            m = measure(q, k, v, causal, kernel, a.rounds, a.mode)
                        except ValueError as e:  # the overlap kernel does not run at this head dim
                            print(f"| {kind} | {d} | {n} | {causal} | {kernel} | {e} |||||", flush=True)
                            continue
                        row.update(m, **summarise(m["ms"], fwd_flops(B, H, n, d, causal)))
                        _report(res, row, a.json)
                del q, k, v
                torch.cuda.empty_cache()
    if a.layer:
        for d in map(int, a.d.split(",")):
            for n in map(int, a.n.split(",")):
                m, flops = measure_layer(d, n, a.rounds)
                row = {"input": "randn", "d": d, "n": n, "causal": True, "kernel": "layer step", **m}
                _report(res, dict(row, **summarise(m["ms"], flops)), a.json)
                torch.cuda.empty_cache()


def _report(res: dict, row: dict, json_path: str | None) -> None:
    """Print a row of the table and keep it (and the JSON file up to date)."""
    res["rows"].append(row)
    t = row["tflops"]
    cost = {sm: "{median:+.1f}% [{p10:+.1f}, {p90:+.1f}]".format(**row[f"{sm}_cost"]) for sm in SOFTMAXES[1:]}
    print(
        f"| {row['input']} | {row['d']} | {row['n']} | {'yes' if row['causal'] else 'no'} | {row['kernel']} | "
        + " | ".join(f"{t[sm]:.0f}" for sm in SOFTMAXES)
        + " | "
        + " | ".join(cost[sm] for sm in SOFTMAXES[1:])
        + " |",
        flush=True,
    )
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
