"""How often the fixes move a block's shift, per row and per group of rows, on the GPU benchmark's inputs.

    PYTHONPATH=. python benchmarks/tie_rates.py              # N = 4096, d = 128, 1024 query rows
    PYTHONPATH=. python benchmarks/tie_rates.py --rows 1024 --block 64

Why: a kernel could compute P with the standard shift and redo a block only where a fix moves the shift
(docs/performance.md, "Where the fix's cost comes from"). A GPU branch is uniform over a warp (16 query
rows of a wgmma tile) or, in Gluon, over a compute warpgroup (64 rows), so what matters is how often any
row of such a group is moved. Per K/V block of ``--block`` keys and query row, by flashsim's variants under
the kernels' policy: "tie" = the fix's test holds (stabilised: more than one score >= r - eps; robust:
two in the band, or a split tie); "moved" = the fix's running max differs from the standard one (what a
redo would cost). Scores are float32 products of bf16-rounded inputs (numpy's summation order, not the
tensor cores': rates, not bits).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import emufloat as ef  # noqa: E402
from flashsim import arith  # noqa: E402
from flashsim.inputs import draw_head  # noqa: E402
from flashsim.policy import get_policy  # noqa: E402
from flashsim.softmax import MaxContext, get_softmax  # noqa: E402


def scores(kind: str, rows: int, n: int, d: int, seed: int) -> np.ndarray:
    """(rows, n) float32 scores q k^T of one head of ``kind`` (flashsim.inputs), inputs rounded to bf16."""
    h = draw_head(np.random.default_rng(seed), kind, rows, n, d)
    q, k = (ef.quantize(h[x], ef.BF16).astype(np.float32) for x in ("q", "k"))
    return q @ k.T


def decisions(s: np.ndarray, block: int, scale: float, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """(tie, moved), boolean (rows, blocks): whether the fix finds a tie (flashsim's own test) and whether
    its running max leaves the standard one (max(m_old, r * c)), block after block, as the Triton kernels'
    unmasked blocks compute them (flashsim's ``triton_h100`` policy: raw scores, m in log2 units)."""
    pol = get_policy("triton_h100")
    fix = get_softmax(variant)
    c = arith.constant(scale * math.log2(math.e), pol.scale)
    ctx = MaxContext(pol.max, 1.0 / scale, None, "max", m_scale=c, m_units=math.log2(math.e))
    m_old = np.full(s.shape[0], -np.inf, np.float32)
    ties, moved = [], []
    for j in range(s.shape[1] // block):
        blk = s[:, j * block:(j + 1) * block]
        r = arith.rowmax(blk)
        tie = (fix.repeated(blk, None, r, ctx) if variant == "stabilised"
               else fix.tie_prone(blk, None, r, m_old, ctx))
        m_fix = np.maximum(m_old, arith.binary("mul", fix.block_max(blk, None, r, m_old, ctx), c, pol.scale))
        m_std = np.maximum(m_old, arith.binary("mul", r, c, pol.scale))
        ties.append(tie)
        moved.append(m_fix != m_std)
        m_old = m_fix
    return np.stack(ties, 1), np.stack(moved, 1)


def any_in_groups(x: np.ndarray, size: int) -> float:
    """Fraction of (group of ``size`` consecutive rows, block) with any row set."""
    rows = x.shape[0] // size * size
    return float(x[:rows].reshape(-1, size, x.shape[1]).any(axis=1).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="keys (default 4096)")
    ap.add_argument("--d", type=int, default=128, help="head dim (default 128)")
    ap.add_argument("--rows", type=int, default=1024, help="query rows drawn per kind (default 1024)")
    ap.add_argument("--block", type=int, default=128, help="keys per K/V block (default 128)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.n % args.block or args.rows % 64:
        ap.error("--n must be a multiple of --block and --rows a multiple of 64")
    print(f"N={args.n} d={args.d} rows={args.rows} block={args.block} seed={args.seed}")
    print("| input | fix | tie (row, block) | moved (row, block) | moved: any of 16 rows | any of 64 rows |")
    print("|---|---|---|---|---|---|")
    for kind in ("random", "repeated", "sink"):
        s = scores(kind, args.rows, args.n, args.d, args.seed)
        for variant in ("stabilised", "robust"):
            tie, moved = decisions(s, args.block, 1.0 / math.sqrt(args.d), variant)
            print(f"| {kind} | {variant} | {tie.mean():.2%} | {moved.mean():.2%} | {any_in_groups(moved, 16):.1%} "
                  f"| {any_in_groups(moved, 64):.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
