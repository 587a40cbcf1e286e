"""Forward and backward of our Triton attention, every softmax variant paired with the standard one, beside
SDPA's backends, FlexAttention and FlashAttention-4, in one run.

    python -m benchmarks.bench_gpu [--n 1024,4096,16384] [--d 64,128] [--dtypes bf16,fp16,fp8] [--rounds 7]
        [--json FILE] [--seconds S] [--no-flex]

H=32 heads and B = 16384 / N sequences (16,384 tokens a batch: B=16 at N=1024, 4 at 4096, 1 at 16384), causal and
not. Per shape, dtype and pass, a round launches every implementation once, back to back
in an order rotated from round to round, each after an L2 flush outside its CUDA events (do_bench's regime,
paired: `benchmarks.fix_cost.paired_rounds`), so that neighbouring launches see the same clocks. Reported per
implementation: the median TFLOP/s over the rounds (backward: 2.5x the forward's FLOPs) with its 10-90%
range; per softmax variant, its cost against the standard softmax as the median over the rounds of the paired
1 - t_standard / t_variant, with its 10-90% range; and the recommended softmax (cast_sum) against cuDNN, SDPA
flash, FlexAttention and FA4, from the medians.

Implementations: `ours_<softmax>` (`gpu.flash.attention`: the forward kernel "auto" picks, the backward of the tl
kernels) for bf16 and fp16; SDPA's cuDNN, flash and memory-efficient backends; `fa4` (FlashAttention-4's
`flash_attn_func` and its default, nondeterministic backward, where the flash-attn-4 package is installed:
studies/device/fa4_install.sh); `flex` (FlexAttention compiled by Inductor as users compile it,
`torch.compile(flex_attention, fullgraph=True)` once for the run, so that after the first shape Dynamo recompiles it
for dynamic shapes; causal by a block mask; the recompile limit raised and buffer donation off for the run:
`_compiled_flex`). FP8 (float8_e4m3fn q, k, v, O in bf16): our forward only, each variant with P V promoted to
FP32 (the default), `ours_standard_fast` (the standard softmax on the FP8 tensor cores' own accumulation: the fast,
leaning one) and `ours_cast_sum_packed` (cast_sum with P's E4M3 values for l from packed conversions,
`Config(e4m3_sum="packed")`: the same bits); FP8 costs are against `ours_standard`. Needs a CUDA GPU (torch,
Triton): `python -m benchmarks.bench_gpu --json $OUT/bench.json --seconds 480`. With ``--json`` the file is written
again after every shape, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np

TOKENS, H = 16384, 32
DTYPES = ("bf16", "fp16", "fp8")
SOFTMAXES = ("standard", "stabilised", "robust", "cast_sum")
RECOMMENDED = "cast_sum"
BASELINES = ("sdpa_cudnn", "sdpa_flash", "flex", "fa4")


def batch(n: int) -> int:
    """Sequences a batch at key count n: `TOKENS` tokens in all (at least one sequence)."""
    return max(1, TOKENS // n)


def implementations(d: int, n: int, causal: bool, dtype: str, flex: bool = True) -> tuple[dict, dict, float]:
    """({name: forward call}, {name: backward call}, forward FLOPs) on fresh inputs; a name whose setup fails
    maps to the error's text."""
    import torch

    from gpu import flash
    from gpu.configs import fwd_config
    from studies.device.run_attention import fwd_flops, rand, run_sdpa, sdpa_backends

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}[dtype]
    B = batch(n)
    q, k, v = rand((B, H, n, d), tdt)
    do = torch.randn_like(q)
    fwd: dict = {}
    bwd: dict = {}
    if dtype == "fp8":
        q8, k8, v8 = (x.to(flash.FP8) for x in (q, k, v))
        for sm in SOFTMAXES:
            fwd[f"ours_{sm}"] = partial(flash.forward, q8, k8, v8, causal=causal, softmax=sm)
        fwd["ours_standard_fast"] = partial(
            flash.forward, q8, k8, v8, causal=causal, softmax="standard", promote_pv=False
        )
        packed = dataclasses.replace(fwd_config("e4m3", d, causal), e4m3_sum="packed")
        fwd["ours_cast_sum_packed"] = partial(
            flash.forward, q8, k8, v8, causal=causal, softmax="cast_sum", config=packed
        )
        return fwd, bwd, fwd_flops(B, H, n, d, causal)
    for sm in SOFTMAXES:
        fwd[f"ours_{sm}"], bwd[f"ours_{sm}"] = _with_backward(flash.attention, q, k, v, do, causal=causal, softmax=sm)
    for name, be in sdpa_backends().items():
        fwd[f"sdpa_{name}"], bwd[f"sdpa_{name}"] = _with_backward(run_sdpa, q, k, v, do, backend=be, causal=causal)
    fa4 = _fa4(causal)
    if fa4 is not None:  # its own layout (B, N, H, d), made once outside the timed calls
        fwd["fa4"], bwd["fa4"] = _with_backward(fa4, *(x.transpose(1, 2).contiguous() for x in (q, k, v, do)))
    if not flex:
        return fwd, bwd, fwd_flops(B, H, n, d, causal)
    try:
        fwd["flex"], bwd["flex"] = _with_backward(_flex(n, causal), q, k, v, do)
    except Exception as exc:  # noqa: BLE001 - FlexAttention may not compile here; the table says why
        fwd["flex"] = bwd["flex"] = repr(exc)[:200]
    return fwd, bwd, fwd_flops(B, H, n, d, causal)


def _fa4(causal: bool):
    """FlashAttention-4's `flash_attn_func` (the flash-attn-4 package, where installed: studies/device/
    fa4_install.sh) on tensors in its layout, returning O; None where the package is not there."""
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        return None

    def call(q, k, v):
        o = flash_attn_func(q, k, v, causal=causal)
        return o[0] if isinstance(o, tuple) else o

    return call


@functools.cache
def _compiled_flex():
    """flex_attention compiled once for the run, as a user compiles it.  Every shape and mask is a recompile, so
    Dynamo's recompile limit is raised for the run; and the backward keeps its buffers (no donation), so that one
    graph's backward can be timed again (``retain_graph``)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = 256
    torch._functorch.config.donated_buffer = False
    return torch.compile(flex_attention, fullgraph=True)


def _flex(n: int, causal: bool):
    """FlexAttention, causal by a block mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, n, n) if causal else None
    compiled = _compiled_flex()
    return lambda q, k, v: compiled(q, k, v, block_mask=mask)


def _with_backward(fn, q, k, v, do, **kw):
    """(forward call, backward call) of an autograd attention function on q, k, v (a failure: its text)."""
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    try:
        o = fn(qq, kk, vv, **kw)
    except Exception as exc:  # noqa: BLE001 - a backend may not support a shape
        return repr(exc)[:200], repr(exc)[:200]
    return partial(fn, q, k, v, **kw), partial(o.backward, do, retain_graph=True)


def measure(d: int, n: int, causal: bool, dtype: str, rounds: int, flex: bool = True) -> dict:
    """Per pass: ms of every implementation in every round (`paired_rounds`); errors as strings."""
    import torch

    from benchmarks.fix_cost import paired_rounds

    fwd, bwd, flops = implementations(d, n, causal, dtype, flex)
    row: dict = {"d": d, "n": n, "batch": batch(n), "causal": causal, "dtype": dtype, "flops": flops}
    row |= {"ms": {}, "errors": {}}
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda").zero_
    for pass_, calls in (("fwd", fwd), ("bwd", bwd)):
        ok = {}
        for name, call in calls.items():
            if isinstance(call, str):
                row["errors"][f"{pass_}/{name}"] = call
                continue
            try:
                call()  # compile and warm up
                ok[name] = call
            except Exception as exc:  # noqa: BLE001 - a backend may not support a shape
                row["errors"][f"{pass_}/{name}"] = repr(exc)[:200]
        torch.cuda.synchronize()
        if ok:
            row["ms"][pass_] = paired_rounds(ok, rounds, before=flush)
    return row


def summarise(row: dict) -> dict:
    """Per pass: each implementation's median TFLOP/s and 10-90% range, and each variant's paired cost against
    the standard softmax (median and 10-90% range over the rounds, in %)."""
    from benchmarks.fix_cost import paired_cost

    out: dict = {}
    for pass_, ms in row["ms"].items():
        flops = row["flops"] * (2.5 if pass_ == "bwd" else 1.0)
        tf = {}
        for name, times in ms.items():
            t = np.asarray(times, float)
            lo, hi = np.quantile(flops / t / 1e9, [0.1, 0.9])
            tf[name] = {"median": flops / statistics.median(times) / 1e9, "p10": float(lo), "p90": float(hi)}
        costs = {
            name: paired_cost(ms["ours_standard"], times)
            for name, times in ms.items()
            if name.startswith("ours_") and name != "ours_standard" and "ours_standard" in ms
        }
        out[pass_] = {"tflops": tf, "cost": costs}
    return out


def table(rows: list[dict]) -> str:
    """Markdown: median TFLOP/s per implementation, the variants' paired costs (median [10%, 90%]) and the
    recommended softmax against the baselines."""
    names = sorted({n for r in rows for ms in r["ms"].values() for n in ms}, key=_order)
    variants = [f"ours_{sm}" for sm in SOFTMAXES[1:]] + ["ours_standard_fast", "ours_cast_sum_packed"]
    head = ["pass", "dtype", "d", "N", "B", "causal", *names, *(f"{v[5:]} cost" for v in variants)]
    head += [f"{RECOMMENDED}/{b.removeprefix('sdpa_')}" for b in BASELINES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pass_ in ("fwd", "bwd"):
        for row in rows:
            if pass_ not in row["ms"]:
                continue
            s = summarise(row)[pass_]
            tf, cost = s["tflops"], s["cost"]
            cells = [
                pass_,
                row["dtype"],
                str(row["d"]),
                str(row["n"]),
                str(row["batch"]),
                "yes" if row["causal"] else "no",
            ]
            cells += [f"{tf[n]['median']:.0f}" if n in tf else "—" for n in names]
            cells += [
                f"{cost[v]['median']:+.1f}% [{cost[v]['p10']:+.1f}, {cost[v]['p90']:+.1f}]" if v in cost else "—"
                for v in variants
            ]
            rec = tf.get(f"ours_{RECOMMENDED}")
            cells += [f"{rec['median'] / tf[b]['median']:.2f}x" if rec and b in tf else "—" for b in BASELINES]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _order(name: str) -> tuple[int, str]:
    """Ours first (the standard softmax leading), then the baselines."""
    if name == "ours_standard":
        return (0, "")
    return (1 if name.startswith("ours_") else 2, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma list of {', '.join(DTYPES)}")
    ap.add_argument("--rounds", type=int, default=7, help="paired rounds per shape, dtype and pass (>= 5)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows (every round's time) and the environment")
    ap.add_argument("--no-flex", action="store_true", help="leave FlexAttention out (it compiles for every shape)")
    ap.add_argument("--seconds", type=float, default=1e9, help="stop starting new shapes after this long")
    args = ap.parse_args(argv)
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= set(DTYPES) or args.rounds < 5:
        raise SystemExit(f"bench_gpu: --dtypes takes {', '.join(DTYPES)}; --rounds at least 5")
    try:
        import torch
    except ImportError:
        raise SystemExit("bench_gpu: needs torch with a CUDA GPU; torch is not installed") from None
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu: needs a CUDA GPU")
    from studies.device.run_attention import env, env_line

    t0, rows, e = time.time(), [], env()
    for dtype in dtypes:
        for d in (int(x) for x in args.d.split(",")):
            for n in (int(x) for x in args.n.split(",")):
                for causal in (False, True):
                    if time.time() - t0 > args.seconds:
                        break
                    rows.append(measure(d, n, causal, dtype, args.rounds, not args.no_flex))
                    print(f"measured {dtype} d={d} N={n} causal={causal} at {time.time() - t0:.0f} s", flush=True)
                    if args.json:  # every shape: a run cut short keeps what it measured
                        Path(args.json).write_text(json.dumps({"env": e, "rounds": args.rounds, "bench": rows}))
    print(
        f"\n# bench_gpu: {TOKENS} tokens a batch, H={H}, {env_line(e)}; median TFLOP/s over {args.rounds} paired "
        "rounds (backward: "
        "2.5x the forward's FLOPs); cost = 1 - t_standard / t_variant per round, median [10%, 90%]\n"
    )
    print(table(rows))
    for row in rows:
        for key, why in row["errors"].items():
            print(f"{row['dtype']} d={row['d']} N={row['n']} causal={row['causal']} {key}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
