"""Probe 4: the order in which tl.sum (and tl.max) reduce an fp32 row of a [BLOCK_M, BLOCK_N] tile.

Variant `dot`: the tile is the result of `tl.dot(q0, k0, x)` with q0, k0 zero bf16 tiles loaded from memory
and x the probe values as the accumulator, so the reduction sees the wgmma accumulator layout of an attention
kernel's score tile (the pass-through d == x is checked). Variant `load`: the reduction of a plainly loaded x.

FPRev probing (studies.probes.trees): all pairs i < j of positions, each placed in every row position over the
tiles (tile t, row r holds pair (t + r) mod P), so a tree is inferred for every row position. tl.max is
exact, so only its signed-zero and NaN behaviour is recorded. 10240 random rows per BLOCK_N are stored with
their GPU sums and maxima as bits, and the inferred tree is checked against them.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import triton
import triton.language as tl

from . import torchutil as tu
from . import trees as T
from .common import hexbits
from .inputs import random_rows

CONFIGS = [(bm, bn, w) for bm in (64, 128) for bn in (64, 128) for w in (4, 8)]
N_RANDOM_ROWS = 10240


@triton.jit
def _row_reduce_kernel(
    x_ptr, q_ptr, k_ptr, sum_ptr, max_ptr, d_ptr, BM: tl.constexpr, BN: tl.constexpr, VIA_DOT: tl.constexpr,
    STORE_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    x = tl.load(x_ptr + t * BM * BN + rm[:, None] * BN + rn[None, :])
    if VIA_DOT:
        rk = tl.arange(0, 16)
        q = tl.load(q_ptr + rm[:, None] * 16 + rk[None, :])
        k = tl.load(k_ptr + rk[:, None] * BN + rn[None, :])
        s = tl.dot(q, k, x)
    else:
        s = x
    tl.store(sum_ptr + t * BM + rm, tl.sum(s, 1))
    tl.store(max_ptr + t * BM + rm, tl.max(s, 1))
    if STORE_D:
        tl.store(d_ptr + t * BM * BN + rm[:, None] * BN + rn[None, :], s)


class TritonReduceBackend:
    def __init__(self) -> None:
        self.evidence: dict = {}

    def reduce(self, x: torch.Tensor, bm: int, bn: int, warps: int, via_dot: bool, store_d: bool = False):
        """x: [tiles, bm, bn] float32. Returns (sums [tiles, bm], maxs [tiles, bm], d or None)."""
        tiles = x.shape[0]
        dev = x.device
        sums = torch.empty((tiles, bm), dtype=torch.float32, device=dev)
        maxs = torch.empty_like(sums)
        d = torch.empty_like(x) if store_d else sums
        q = torch.zeros((bm, 16), dtype=torch.bfloat16, device=dev)
        k = torch.zeros((16, bn), dtype=torch.bfloat16, device=dev)
        kern = _row_reduce_kernel[(tiles,)](
            x, q, k, sums, maxs, d, BM=bm, BN=bn, VIA_DOT=via_dot, STORE_D=store_d, num_warps=warps
        )
        key = f"BM{bm}_BN{bn}_w{warps}_{'dot' if via_dot else 'load'}{'_stored' if store_d else ''}"
        if key not in self.evidence:
            self.evidence[key] = tu.kernel_evidence(kern)
        return sums, maxs, (d if store_d else None)


def fprev_tiles(bn: int, bm: int, device) -> tuple[torch.Tensor, np.ndarray]:
    """[P, bm, bn] tiles: tile t, row r holds pair (t + r) mod P (+BIG at i, -BIG at j, 1 elsewhere)."""
    pairs = T.all_pairs(bn)
    P = len(pairs)
    pt = torch.from_numpy(pairs).to(device)
    t = torch.arange(P, device=device)[:, None]
    r = torch.arange(bm, device=device)[None, :]
    p = (t + r) % P
    x = torch.ones((P, bm, bn), dtype=torch.float32, device=device)
    tt = t.expand(P, bm)
    rr = r.expand(P, bm)
    x[tt, rr, pt[p, 0]] = T.BIG
    x[tt, rr, pt[p, 1]] = -T.BIG
    return x, pairs


def max_zero_nan_tests(bn: int) -> tuple[np.ndarray, list[str]]:
    rows, names = [], []
    for p in range(bn):
        r = np.full(bn, -0.0, dtype=np.float32)
        r[p] = 0.0
        rows.append(r)
        names.append(f"neg0_with_pos0_at_{p}")
        r = np.zeros(bn, dtype=np.float32)
        r[p] = -0.0
        rows.append(r)
        names.append(f"pos0_with_neg0_at_{p}")
        r = np.ones(bn, dtype=np.float32)
        r[p] = np.nan
        rows.append(r)
        names.append(f"nan_at_{p}")
    rows.append(np.full(bn, -0.0, dtype=np.float32))
    names.append("all_neg0")
    return np.stack(rows), names


def run(ctx) -> dict:
    dev = ctx.device
    be = ctx.backend or TritonReduceBackend()
    params = getattr(ctx, "params", {}) or {}
    configs = params.get("reduction_configs", CONFIGS[:2] if ctx.quick else CONFIGS)
    variants = params.get("reduction_variants", ("dot", "load"))
    n_rows = params.get("reduction_rows", 1024 if ctx.quick else N_RANDOM_ROWS)
    rng = np.random.default_rng(ctx.seed + 7)
    rows_by_bn = {}
    arrays: dict = {}
    for bn in sorted({c[1] for c in configs}):
        rows, kinds = random_rows(rng, n_rows, bn)
        rows_by_bn[bn] = rows
        arrays[f"rows_BN{bn}"] = rows.view(np.uint32)
        arrays[f"rows_BN{bn}_kind"] = kinds
    result: dict = {
        "seed": ctx.seed + 7,
        "big": T.BIG,
        "random_row_kinds": ["normal", "exp_like", "wide", "cancel", "bits"],
        "configs": {},
    }
    for bm, bn, w in configs:
        for var in variants:
            key = f"BM{bm}_BN{bn}_w{w}_{var}"
            if ctx.time_left() < 15:
                result["configs"][key] = {"skipped": "time budget"}
                continue
            t0 = time.monotonic()
            try:
                result["configs"][key] = probe_config(be, bm, bn, w, var == "dot", rows_by_bn[bn], arrays, key, dev)
            except Exception as e:  # noqa: BLE001
                import traceback

                result["configs"][key] = {"error": repr(e)[:500], "traceback": traceback.format_exc()[-3000:]}
            result["configs"][key]["seconds"] = time.monotonic() - t0
            ctx.log(f"reduction: {key}: {_one_line(result['configs'][key])}")
            ctx.checkpoint({"partial": True, **result})
    np.savez_compressed(ctx.out / "reduction.npz", **arrays)
    result["npz"] = "reduction.npz"
    result["evidence"] = getattr(be, "evidence", {})
    result["summary"] = {k: _one_line(v) for k, v in result["configs"].items()}
    return result


def _one_line(r: dict) -> str:
    if "error" in r or "skipped" in r:
        return r.get("error") or r.get("skipped")
    t0 = r["trees"][0]["shape"] if r.get("trees") else {}
    return (
        f"trees={r.get('n_distinct_trees')} consistent={r.get('all_consistent')} depth={t0.get('depth')} "
        f"split={t0.get('root_splits', [[]])[0] if t0.get('root_splits') else None} "
        f"random_match={r.get('random_rows', {}).get('tree_model_match')}/{r.get('random_rows', {}).get('n')}"
    )


def pack_rows(rows: np.ndarray, bm: int, bn: int, dev, fill: float) -> torch.Tensor:
    """fp32 rows as [tiles, bm, bn] on the device, the last tile padded with rows of `fill`."""
    ntile = -(-rows.shape[0] // bm)
    buf = np.full((ntile * bm, bn), fill, dtype=np.float32)
    buf[: rows.shape[0]] = rows
    return torch.from_numpy(buf.reshape(ntile, bm, bn)).to(dev)


def reduce_rows(be, x: torch.Tensor, n: int, bm: int, bn: int, w: int, via_dot: bool):
    """tl.sum and tl.max of the first `n` rows of packed tiles, as numpy arrays."""
    s, m, _ = be.reduce(x, bm, bn, w, via_dot)
    return s.reshape(-1)[:n].cpu().numpy(), m.reshape(-1)[:n].cpu().numpy()


def probe_config(be, bm: int, bn: int, w: int, via_dot: bool, rows: np.ndarray, arrays: dict, key: str, dev) -> dict:
    out: dict = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "variant": "dot" if via_dot else "load"}
    # FPRev
    x, pairs = fprev_tiles(bn, bm, dev)
    P = len(pairs)
    sums, _, _ = be.reduce(x, bm, bn, w, via_dot)
    del x
    S = sums.cpu().numpy().astype(np.float64)  # [P tiles, bm rows]
    idx = (np.arange(P)[:, None] - np.arange(bm)[None, :]) % P
    R = S[idx, np.arange(bm)[None, :]]  # R[p, r]: sum of pair p placed at row r
    sizes_all, bad = T.lca_sizes_from_sums(R, bn)
    out["pairs"] = P
    out["bad_probe_results"] = bad
    cols, inv = np.unique(sizes_all.T, axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    out["row_invariant"] = len(cols) == 1
    out["n_distinct_trees"] = int(len(cols))
    trees_out = []
    row_tree = {}
    for ci in range(len(cols)):
        rows_ci = np.nonzero(inv == ci)[0].tolist()
        inf = T.infer_tree(bn, pairs, cols[ci])
        trees_out.append(
            {
                "rows": rows_ci if len(rows_ci) < bm else "all",
                "tree": inf["tree"],
                "consistent": inf["consistent"],
                "problems": inf["problems"],
                "lca_mismatch": inf["lca_mismatch"],
                "shape": T.describe(inf["tree"]),
            }
        )
        for r in rows_ci:
            row_tree[r] = inf["tree"]
    out["trees"] = trees_out[:8]
    out["all_consistent"] = all(t["consistent"] for t in trees_out)
    ok = np.isfinite(R) & (R == np.round(R)) & (R >= 0) & (R <= 254)
    arrays[f"{key}_fprev_sums"] = np.where(ok, R, 255).astype(np.uint8)
    # tl.max / signed zeros / NaN
    tests, names = max_zero_nan_tests(bn)
    s2, m2 = reduce_rows(be, pack_rows(np.asarray(tests), bm, bn, dev, 1.0), len(tests), bm, bn, w, via_dot)
    fam: dict = {}
    for name, sv, mv in zip(names, s2, m2, strict=True):
        f = name.rsplit("_at_", 1)[0]
        d = fam.setdefault(f, {"max_results": {}, "sum_results": {}})
        hb = hexbits(int(np.float32(mv).view(np.uint32)))
        d["max_results"][hb] = d["max_results"].get(hb, 0) + 1
        hs = hexbits(int(np.float32(sv).view(np.uint32)))
        d["sum_results"][hs] = d["sum_results"].get(hs, 0) + 1
    out["max_signed_zero_nan"] = fam
    # random rows
    n = rows.shape[0]
    xr = pack_rows(rows, bm, bn, dev, 0.0)
    sums_r, maxs_r = reduce_rows(be, xr, n, bm, bn, w, via_dot)
    rr = {"n": n}
    if via_dot:
        _, _, d = be.reduce(xr, bm, bn, w, via_dot, store_d=True)
        dd = d.reshape(-1, bn)[:n].contiguous().view(torch.int32).cpu().numpy().view(np.uint32)
        rr["passthrough_mismatch"] = int((dd != rows.view(np.uint32)).sum())
    arrays[f"{key}_sum"] = sums_r.view(np.uint32)
    arrays[f"{key}_max"] = maxs_r.view(np.uint32)
    # model: evaluate the inferred tree of each row position
    model = np.zeros(n, dtype=np.float32)
    rpos = np.arange(n) % bm
    for r, tree in row_tree.items():
        sel = rpos == r
        if sel.any():
            model[sel] = T.eval_tree(tree, rows[sel])
    eq = (model.view(np.uint32) == sums_r.view(np.uint32)) | (np.isnan(model) & np.isnan(sums_r))
    rr["tree_model_match"] = int(eq.sum())
    rr["first_mismatches"] = [
        {"row": int(i), "gpu": hexbits(int(sums_r.view(np.uint32)[i])), "tree": hexbits(int(model.view(np.uint32)[i]))}
        for i in np.nonzero(~eq)[0][:5]
    ]
    with np.errstate(invalid="ignore"):
        rr["max_equals_numpy_max"] = int((np.max(rows, axis=1) == maxs_r).sum())
    out["random_rows"] = rr
    return out
