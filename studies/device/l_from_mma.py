"""Does summing l on the tensor cores make `cast_sum` free?  A study of the tl forward kernel's loop with l
accumulated by a second ``tl.dot``: the cast P times a (BLOCK_N, 16) block of ones, rescaled by alpha as acc is,
so the same wgmma arithmetic that forms P V also forms the row sum of the cast P, and no ALU row sum is left.

    PYTHONPATH=. python -m studies.device.l_from_mma --out $OUT [--rounds 15]

Times, in paired rounds (`benchmarks.fix_cost.paired_rounds`, an L2 flush before each launch), at 16,384 tokens
a batch and 32 heads, bf16 and fp16, d 64 and 128, N 1024/4096/16384, causal and not: the package's tl kernel
with the standard softmax and with `cast_sum`, and this loop with the standard softmax, with l from the tensor
cores, and with `cast_sum` by `steps.cast_and_widened` (its bits compared with the package's).  Writes
`l_from_mma.json` (every round's times, the paired costs against the standard softmax, the largest differences
of O and the LSE from `cast_sum`'s) and, for a CPU check of the emulator's model of this l, the bits of O and LSE of
small launches (`l_from_mma_bits.npz`, inputs by seed: `flashsim.inputs.make_heads`).
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import triton
import triton.language as tl

from gpu.kernels.steps import (
    cast_and_widened,
    log2_fma,
    masked_block,
    plain_block,
    program_blocks,
    rescale,
    weights,
)

ONES_COLS = 16  # the narrowest wgmma N Triton emits for a bf16/fp16 product
#: the loop's row sum: the package's `weights` (its SOFTMAX's), l from the tensor cores, or cast_sum by
#: `steps.cast_and_widened` (one packed conversion of two P values, widened from the packed register: what the
#: package's kernels took from this study)
SUMS = {"package": 0, "l_mma": 1, "packed": 2}


@triton.jit
def _loop(
    acc,
    lacc,
    l_i,
    m_i,
    q,
    K,
    V,
    base,
    offs_m,
    offs_n,
    offs_d,
    first_row,
    start,
    stop,
    N_K,
    consts,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
    SOFTMAX: tl.constexpr,
    STAGES: tl.constexpr,
    L_SUM: tl.constexpr,
):
    FOLD: tl.constexpr = BLOCK_N < 128
    ones = tl.full([BLOCK_N, 16], 1.0, V.dtype.element_ty)
    for start_n in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = start_n + offs_n
        col_ok = cols < N_K
        ptrs = base + cols[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            k = tl.load(K + ptrs, mask=col_ok[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k))
            m_new, x = masked_block(
                qk, start_n, offs_m, offs_n, first_row, N_K, m_i, consts, BLOCK_N, CAUSAL, SOFTMAX, FOLD
            )
            v = tl.load(V + ptrs, mask=col_ok[:, None], other=0.0)
        else:
            k = tl.load(K + ptrs)
            qk = tl.dot(q, tl.trans(k))
            m_new, x = plain_block(qk, m_i, consts, SOFTMAX, FOLD)
            v = tl.load(V + ptrs)
        if L_SUM == 2:
            p_cast, wide = cast_and_widened(tl.math.exp2(x), V.dtype.element_ty)
            alpha = tl.math.exp2(m_i - m_new)
            l_i = tl.fma(l_i, alpha, tl.sum(wide, 1))
        else:
            p, p_cast, alpha, l_i = weights(x, m_i, m_new, l_i, V.dtype.element_ty, SOFTMAX)
        acc = rescale(acc, alpha)
        acc = tl.dot(p_cast, v, acc)
        if L_SUM == 1:
            lacc = rescale(lacc, alpha)
            lacc = tl.dot(p_cast, ones, lacc)
        m_i = m_new
    return acc, lacc, l_i, m_i


@triton.jit
def fwd(
    Q,
    K,
    V,
    O,
    LSE,
    consts,
    N_Q,
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    STAGES: tl.constexpr,
    L_SUM: tl.constexpr,
):
    start_m, hz, lo, hi = program_blocks(N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    off_hz = hz.to(tl.int64)
    base = off_hz * N_K * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q_ptrs = off_hz * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    lacc = tl.zeros([BLOCK_M, 16], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first_row = start_m * BLOCK_M
    acc, lacc, l_i, m_i = _loop(
        acc, lacc, l_i, m_i, q, K, V, base, offs_m, offs_n, offs_d, first_row, 0, lo, N_K, consts, HEAD_DIM,
        BLOCK_N, CAUSAL, False, SOFTMAX, STAGES, L_SUM,
    )  # fmt: skip
    acc, lacc, l_i, m_i = _loop(
        acc, lacc, l_i, m_i, q, K, V, base, offs_m, offs_n, offs_d, first_row, lo, hi, N_K, consts, HEAD_DIM,
        BLOCK_N, CAUSAL, True, SOFTMAX, 1, L_SUM,
    )  # fmt: skip
    if L_SUM == 1:
        l_i = tl.max(lacc, 1)  # the 16 columns hold the same sums
    lse = m_i + log2_fma(l_i)
    o = acc / l_i[:, None]
    tl.store(LSE + off_hz * N_Q + offs_m, lse, mask=row_ok)
    tl.store(O + q_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])


def launch(q, k, v, causal: bool, softmax: str, l_sum: str):
    """(O, LSE base 2) of this study's kernel on (B, H, N, d) tensors, the package's tiles for the shape."""
    import torch

    from gpu.configs import fwd_config, kernel_variant
    from gpu.flash import SOFTMAX_IDS, softmax_constants

    b, h, n, d = q.shape
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[q.dtype]
    cfg = fwd_config(dtype, d, causal)
    consts = softmax_constants(kernel_variant(softmax, dtype), d**-0.5)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n), device=q.device, dtype=torch.float32)
    stages = PIPELINE.get((dtype, d, causal, l_sum), cfg.num_stages)
    while True:
        try:
            fwd[(triton.cdiv(n, cfg.block_m), b * h)](
                q, k, v, o, lse, consts, n, n, HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                CAUSAL=causal, SOFTMAX=SOFTMAX_IDS[softmax], STAGES=stages, L_SUM=SUMS[l_sum], num_warps=cfg.num_warps,
                num_stages=stages,
            )  # fmt: skip
            PIPELINE[dtype, d, causal, l_sum] = stages
            return o, lse
        except triton.runtime.errors.OutOfResources:  # the ones tile's shared memory: one stage fewer
            if stages == 1:
                raise
            stages -= 1


#: the pipeline depth each variant ran at (the package's, or fewer where the ones tile does not fit)
PIPELINE: dict[tuple, int] = {}


def measure(dtype: str, d: int, n: int, causal: bool, rounds: int) -> dict:
    """One shape's paired rounds: the package's tl kernel (standard, cast_sum) and this study's loop."""
    import torch

    from benchmarks.fix_cost import paired_cost, paired_rounds
    from gpu import flash
    from studies.device.run_attention import fwd_flops, rand

    b = max(1, 16384 // n)
    q, k, v = rand((b, 32, n, d), {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    ours = partial(flash.forward, q, k, v, causal=causal, kernel="triton")
    calls = {
        "ours_standard": partial(ours, softmax="standard"),
        "ours_cast_sum": partial(ours, softmax="cast_sum"),
        "study_standard": partial(launch, q, k, v, causal, "standard", "package"),
        "study_l_mma": partial(launch, q, k, v, causal, "standard", "l_mma"),
        "study_packed": partial(launch, q, k, v, causal, "cast_sum", "packed"),
    }
    got = {name: fn() for name, fn in calls.items()}
    torch.cuda.synchronize()
    (ref_o, ref_lse), (o, lse), (po, plse) = got["ours_cast_sum"][:2], got["study_l_mma"], got["study_packed"]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda").zero_
    ms = paired_rounds(calls, rounds, before=flush)
    flops = fwd_flops(b, 32, n, d, causal)
    return {
        "dtype": dtype,
        "d": d,
        "n": n,
        "batch": b,
        "causal": causal,
        "ms": ms,
        "tflops": {key: flops / float(np.median(t)) / 1e9 for key, t in ms.items()},
        "cost": {key: paired_cost(ms["ours_standard"], t) for key, t in ms.items() if key != "ours_standard"},
        "o_max_diff_vs_cast_sum": float((o.float() - ref_o.float()).abs().max()),
        "lse_max_diff_vs_cast_sum": float((lse - ref_lse).abs().max()),
        "packed_bits_as_cast_sum": bool(torch.equal(po.view(torch.int16), ref_o.view(torch.int16)))
        and bool(torch.equal(plse.view(torch.int32), ref_lse.view(torch.int32))),
    }


def small_bits() -> tuple[dict[str, np.ndarray], list[dict]]:
    """O and LSE bits of small launches of the l-from-the-tensor-cores loop, inputs by seed, for the CPU."""
    import torch

    from flashsim.inputs import ALL_KINDS, make_heads

    bits, cases = {}, []
    shapes = [(n, d, c) for d in (64, 128) for n in (1, 77, 256) for c in (False, True)]
    for dtype, tdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for i, (n, d, causal) in enumerate(shapes):
            seed = 2_026_700_000 + 100 * i
            x = make_heads(ALL_KINDS, 2, n, n, d, dtype, seed)
            q, k, v = (torch.from_numpy(x[key]).to(tdt).cuda()[None] for key in ("q", "k", "v"))
            o, lse = launch(q, k, v, causal, "standard", "l_mma")
            key = f"{dtype}/n{n}/d{d}/{'causal' if causal else 'full'}"
            bits[f"{key}/o"] = o.cpu().view(torch.int16).numpy()
            bits[f"{key}/lse"] = lse.cpu().view(torch.int32).numpy()
            cases.append({"key": key, "dtype": dtype, "seed": seed, "n": n, "d": d, "causal": causal})
    return bits, cases


def run(out: Path, rounds: int, seconds: float) -> int:
    from studies.device.run_attention import env

    t0, rows = time.time(), []
    bits, small = small_bits()
    np.savez_compressed(out / "l_from_mma_bits.npz", **bits)
    meta = {"env": env(), "command": "PYTHONPATH=. python -m studies.device.l_from_mma --out $OUT", "small": small}
    for dtype in ("bf16", "fp16"):
        for d in (64, 128):
            for n in (1024, 4096, 16384):
                for causal in (False, True):
                    if time.time() - t0 > seconds:
                        break
                    rows.append(r := measure(dtype, d, n, causal, rounds))
                    r["stages"] = {str(k): v for k, v in PIPELINE.items() if k[:3] == (dtype, d, causal)}
                    cost = {key: f"{c['median']:+.1f}%" for key, c in r["cost"].items()}
                    print(
                        f"{dtype} d={d} N={n} causal={causal}: {cost}; |dO| {r['o_max_diff_vs_cast_sum']:.2e}; "
                        f"packed bits as cast_sum: {r['packed_bits_as_cast_sum']}",
                        flush=True,
                    )
                    (out / "l_from_mma.json").write_text(json.dumps(meta | {"rows": rows}))
    return 0


def main(argv: list[str] | None = None) -> int:
    from flashsim.console import ArgumentParser, run_command, writable_dir

    ap = ArgumentParser(prog="python -m studies.device.l_from_mma", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--rounds", type=int, default=15, help="paired rounds a shape")
    ap.add_argument("--seconds", type=float, default=120.0, help="stop starting new shapes after this long")
    args = ap.parse_args(argv)
    return run_command("l_from_mma", lambda: run(writable_dir(args.out, "--out"), args.rounds, args.seconds))


if __name__ == "__main__":
    raise SystemExit(main())
