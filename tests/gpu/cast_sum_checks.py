"""The `cast_sum` forward kernel against flashsim's model under Triton's CPU interpreter; run by
tests/gpu/test_cast_sum_kernel.py as `python tests/gpu/cast_sum_checks.py {full,causal}` with `TRITON_INTERPRET=1`
(it prints "ok" or raises AssertionError).

`python tests/gpu/cast_sum_checks.py api` checks gpu.flash's defaults, names, the robust variant's warning and
`promote_pv`'s refusals.
The interpreter is not the H100 (gpu/kernels/interpreter.py): fp16 only, its sums and dots are numpy's, its
FMA rounds twice.  The inputs are built so that none of that shows: with sm_scale = ln 2 the kernel's
qk_scale is exactly 1, the scores are integers, so every P is a power of two (exp2 is exact there on both),
and every row sum is exact in float32 whatever its order:

- block 0 (keys 0-63): key 0 scores 0, the others 0, -1, -2 or -60 (times the row's scale a = 1 or 2), with V
  small integers: P V and l exact, the 2^-60 terms far below every partial sum's half ulp;
- block 1 (keys 64-127): every score -25 a; V = 0.  P = 2^-25 (a = 1) rounds to 0 in fp16 (half the smallest
  subnormal, to even) but adds 64 * 2^-25 = 2^-19 to the standard softmax's l;
- block 2 (keys 128-149, ragged): scores -24 a or -26 a; V = 0.  2^-24 is fp16's smallest subnormal (kept),
  2^-26 rounds to 0.

So the standard l counts P that P V never sees and `cast_sum`'s does not: on a = 1 rows that see enough of
blocks 1 or 2 the two l differ (a = 2: those P are below l's half ulp).  Per K/V block the kernel's debug
outputs m, P (before its cast), l and acc must equal, bit for bit, what flashsim's
`kernel_policy('fp16', 64, causal)` steps compute with each variant, and each row's final l an oracle's
(exact block sums in float64, one float32 rounding a block).
"""

from __future__ import annotations

import math
import os
import re
import sys

import numpy as np

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashsim.stepper import step_rows  # noqa: E402
from gpu import flash  # noqa: E402
from gpu.kernels.steps import e4m3_values  # noqa: E402
from gpu.policies import kernel_policy, kernel_variant  # noqa: E402

N, D = 150, 64
SCALE = math.log(2.0)  # qk_scale = float32(ln 2 * log2 e) = 1 exactly


def inputs(seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (N, D) float32 holding fp16 values, and each row's scale a."""
    rng = np.random.default_rng(seed)
    a = rng.choice([1.0, 2.0], N)
    level = np.empty(N)
    level[:64] = rng.choice([0.0, -1.0, -2.0, -60.0], 64, p=[0.05, 0.15, 0.2, 0.6])
    level[0] = 0.0
    level[64:128] = -25.0
    level[128:] = rng.choice([-24.0, -26.0], N - 128)
    q = np.zeros((N, D))
    k = np.zeros((N, D))
    v = np.zeros((N, D))
    q[:, 0] = a
    k[:, 0] = level
    v[:64] = rng.integers(-2, 3, (64, D))
    return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), a


def kernel_steps(q, k, v, causal: bool, softmax: str) -> dict[str, np.ndarray]:
    """The tl kernel's debug outputs (blocks, N[, cols]) and O, LSE for one head."""
    t = [torch.from_numpy(x)[None, None].to(torch.float16) for x in (q, k, v)]
    o, lse, dbg = flash.forward(*t, causal=causal, sm_scale=SCALE, softmax=softmax, kernel="triton", debug=True)
    out = {name: x[0].numpy() for name, x in dbg.items()}
    out.update(o=o[0, 0].float().numpy(), lse=lse[0, 0].numpy())
    return out


def model_steps(q, k, v, causal: bool, softmax: str, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """flashsim's per-block m, P, l, acc for the kernel's policy, laid out as the kernel's debug outputs
    (NaN where a block was skipped)."""
    pol = kernel_policy("fp16", D, causal)
    variant = kernel_variant(softmax, "fp16")
    out = {name: np.full_like(like[name], np.nan) for name in ("m", "p", "l", "acc")}
    for start in range(0, N, pol.tiling.block_m):
        rows = slice(start, min(start + pol.tiling.block_m, N))
        for st in step_rows(q, k, v, pol, rows=rows, softmax=variant, causal=causal, sm_scale=SCALE, trace=False):
            out["m"][st.block, rows] = np.asarray(st.m, np.float32).reshape(-1)
            out["l"][st.block, rows] = np.asarray(st.l, np.float32).reshape(-1)
            p = np.asarray(st.p_exp, np.float32)
            out["p"][st.block, rows, : p.shape[1]] = p
            out["acc"][st.block, rows] = np.asarray(st.acc, np.float32)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check(causal: bool) -> None:
    q, k, v, a = inputs()
    final_l = {}
    for softmax in ("standard", "cast_sum"):
        got = kernel_steps(q, k, v, causal, softmax)
        want = model_steps(q, k, v, causal, softmax, got)
        for name in ("m", "p", "l", "acc"):
            g = got[name]
            if name == "p":  # the kernel stores whole blocks; the model's last block is ragged (NaN past N)
                g = np.where(np.isnan(want[name]), np.nan, g)
            bad = np.argwhere(g.view(np.uint32) != want[name].view(np.uint32))
            assert not bad.size, (causal, softmax, name, bad[0], g[tuple(bad[0])], want[name][tuple(bad[0])])
        last = (~np.isnan(got["l"])).cumsum(0).argmax(0)  # each row's last K/V block (later ones skipped)
        final_l[softmax] = got["l"][last, np.arange(N)]
    for softmax, want in oracle_l(q, k, causal).items():
        bad = np.flatnonzero(final_l[softmax].view(np.uint32) != want.view(np.uint32))
        assert not bad.size, (causal, softmax, bad[:5], final_l[softmax][bad[:5]], want[bad[:5]])
    rows = np.arange(N)
    sees_dropped = (a == 1.0) & ((rows >= 64) | (not causal))
    differ = final_l["standard"] != final_l["cast_sum"]
    assert differ.sum() >= 20 and not (differ & ~sees_dropped).any(), (causal, differ.sum())
    # where they differ the standard l is the larger: it counts the P that rounded to 0 in fp16
    assert (final_l["standard"][differ] > final_l["cast_sum"][differ]).all()


def oracle_l(q: np.ndarray, k: np.ndarray, causal: bool) -> dict[str, np.ndarray]:
    """Each row's final l, independently: the block sums of P = 2^(s - max) (cast_sum: of P rounded to fp16
    by numpy) in float64, where they are exact, added to l block by block with one float32 rounding each (the
    row max is key 0's, so alpha = 1)."""
    s = q.astype(np.float64) @ k.T.astype(np.float64)
    visible = np.tril(np.ones((N, N), bool)) if causal else np.ones((N, N), bool)
    p = np.where(visible, np.exp2(s - s[:, :1]), 0.0)
    out = {}
    for softmax, w in (("standard", p), ("cast_sum", p.astype(np.float16).astype(np.float64))):
        l = np.zeros(N, np.float32)
        for j0 in range(0, N, 64):
            seen = visible[:, j0 : j0 + 64].any(1)
            l = np.where(seen, (l + w[:, j0 : j0 + 64].sum(1)).astype(np.float32), l)
        out[softmax] = l
    return out


def check_api() -> None:
    """No softmax named: cast_sum's bits (every dtype's default); 'cast_sum' runs; an unknown name or one
    the kernels lack is refused naming the accepted ones; 'robust' warns (FutureWarning naming docs/fix.md)
    and still computes."""
    import warnings

    import pytest

    rng = np.random.default_rng(1)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 70, 64)).astype(np.float32)).half() for _ in range(3))
    for causal in (False, True):
        default = flash.forward(q, k, v, causal=causal, kernel="triton")
        named = flash.forward(q, k, v, causal=causal, softmax="cast_sum", kernel="triton")
        assert all(torch.equal(a, b) for a, b in zip(default[:2], named[:2], strict=True))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # neither the default nor cast_sum warns
            flash.forward(q, k, v, causal=causal, softmax="cast_sum", kernel="triton")
            flash.forward(q, k, v, causal=causal, kernel="triton")
        with pytest.warns(FutureWarning, match=r"'robust' leans O .*docs/fix\.md"):
            robust = flash.forward(q, k, v, causal=causal, softmax="robust", kernel="triton")
        assert robust[0].shape == q.shape
    accepted = "expected one of ('standard', 'stabilised', 'robust', 'cast_sum') or None"
    for bad in ("dithered", "Standard", ""):
        with pytest.raises(ValueError, match=re.escape(f"softmax: {accepted} (the dtype's default), got {bad!r}")):
            flash.forward(q, k, v, softmax=bad)
    import flashsim as fs

    with pytest.raises(ValueError, match="softmax: the kernels implement standard, stabilised, robust, cast_sum"):
        flash.forward(q, k, v, softmax=fs.get_softmax("dithered"))
    # promote_pv: FP8 only; False is fp16's default (the same bits), True refused naming the argument
    no = flash.forward(q, k, v, kernel="triton", promote_pv=False)
    assert all(torch.equal(a, b) for a, b in zip(no[:2], flash.forward(q, k, v, kernel="triton")[:2], strict=True))
    with pytest.raises(ValueError, match=r"promote_pv: only for float8_e4m3fn inputs .*got torch\.float16"):
        flash.forward(q, k, v, promote_pv=True)
    with pytest.raises((TypeError, ValueError), match="promote_pv"):
        flash.forward(q, k, v, promote_pv="yes")


@triton.jit
def _e4m3_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, e4m3_values(tl.load(X + offs)))


def check_e4m3_values() -> None:
    """gpu.kernels.steps.e4m3_values (the FP8 kernel's l summands) equal to ml_dtypes' RNE cast to E4M3: every
    E4M3 value, its neighbours one float32 ulp away and the midpoints between E4M3 values with theirs, powers
    of two down to 2^-30, and 2^18 random float32 in [0, 1]."""
    import ml_dtypes

    grid = np.arange(0, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)  # 0 .. 448
    grid = grid[grid <= 1.0]
    mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)
    pts = np.concatenate([grid, mids, 2.0 ** -np.arange(31.0)]).astype(np.float32)
    near = np.concatenate([pts, np.nextafter(pts, np.float32(0)), np.nextafter(pts, np.float32(2))])
    rng = np.random.default_rng(5)
    x = np.concatenate([near, rng.random(1 << 18, dtype=np.float32)])
    x = x[(x >= 0) & (x <= 1)]
    n = 1 << int(np.ceil(np.log2(x.size)))
    xs = np.zeros(n, np.float32)
    xs[: x.size] = x
    y = torch.empty(n, dtype=torch.float32)
    _e4m3_kernel[(1,)](torch.from_numpy(xs), y, N=n)
    want = xs.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    bad = np.flatnonzero(y.numpy().view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (
        f"{bad.size} of {n} differ, first x = {xs[bad[0]]!r}: {y.numpy()[bad[0]]!r} vs {want[bad[0]]!r}"
    )


if __name__ == "__main__":
    if sys.argv[1] == "e4m3":
        check_e4m3_values()
        print("ok")
        sys.exit(0)
    if sys.argv[1] == "api":
        check_api()
    else:
        check(sys.argv[1] == "causal")
    print("ok")
