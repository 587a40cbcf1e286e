"""Probe 1: tl.math.exp2 and tl.exp on fp32, over all 2**32 inputs.

For each function f and input x the ex2 argument is z = x (exp2) or z = fl(x * log2e) (exp, the constant
read from the PTX). Per chunk of inputs (bit patterns start..start+size-1, made on the GPU) it measures:

- the signed ulp difference to the correctly rounded result (float64 exp2/exp rounded to float32; inputs whose
  float64 value lies within 2**-40 relative of a float32 midpoint are counted apart), special classes, flushes;
- determinism (a second launch) and a SHA-256 of the output bits per chunk;
- the table model: T_neg[k] = f(-k 2**-23), T_pos[k] = f(k 2**-23) measured on the GPU; quantisation of the
  fraction (truncate / round / floor to the 2**-23 grid) in (-1, 0) and [0, 1); the range reduction
  f(z) == ldexp(f(z - ceil z), ceil z) (and with floor); per binade: distinct outputs, grid cells, and for
  each s the number of aligned groups of 2**s consecutive inputs whose outputs are not all equal;
- the candidate model (|z| to fixed point with 23 fraction bits truncated, table lookup, exact power-of-two
  scaling, flush variants) evaluated on the GPU and compared with every output.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time

import numpy as np
import torch
import triton
import triton.language as tl

from . import torchutil as tu
from .common import Hist, bits_f32, hexbits, ptx_constants

BLOCK = 1024
GRID_BITS = 23
NGRID = 1 << GRID_BITS
LOG2E_F32_BITS = 0x3FB8AA3B


@triton.jit
def _exp2_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(y_ptr + offs, tl.math.exp2(x), mask=m)


@triton.jit
def _exp_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(y_ptr + offs, tl.exp(x), mask=m)


@triton.jit
def _ex2_asm_kernel(x_ptr, y_ptr, n, FTZ: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if FTZ:
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y, mask=m)


class TritonExp2Backend:
    """Runs the probe functions with Triton kernels and keeps the compile evidence."""

    functions = ("exp2", "exp", "ex2_ftz_asm", "ex2_asm")

    def __init__(self) -> None:
        self.evidence: dict = {}
        self.ptx: dict = {}
        self.failed: dict = {}

    def available(self, fn: str) -> bool:
        return fn not in self.failed

    def run(self, fn: str, x: torch.Tensor) -> torch.Tensor:
        if fn in self.failed:
            raise RuntimeError(f"{fn} unavailable: {self.failed[fn]}")
        y = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, BLOCK),)
        try:
            if fn == "exp2":
                k = _exp2_kernel[grid](x, y, n, BLOCK=BLOCK)
            elif fn == "exp":
                k = _exp_kernel[grid](x, y, n, BLOCK=BLOCK)
            elif fn == "ex2_ftz_asm":
                k = _ex2_asm_kernel[grid](x, y, n, FTZ=True, BLOCK=BLOCK)
            elif fn == "ex2_asm":
                k = _ex2_asm_kernel[grid](x, y, n, FTZ=False, BLOCK=BLOCK)
            else:
                raise KeyError(fn)
        except Exception as e:
            if fn.endswith("_asm"):
                self.failed[fn] = repr(e)[:500]
            raise
        if fn not in self.evidence:
            self.evidence[fn] = tu.kernel_evidence(k)
            self.ptx[fn] = tu.ptx_text(k)
        return y


# ----------------------------------------------------------------------------------------------------------
# Reference and model
# ----------------------------------------------------------------------------------------------------------
def reference(fn: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 value, float32 correctly rounded value) of exp2(x) or exp(x)."""
    x64 = x.to(torch.float64)
    r64 = torch.exp2(x64) if fn == "exp2" else torch.exp(x64)
    return r64, r64.to(torch.float32)


def table_lookup_model(z: torch.Tensor, t_neg: torch.Tensor, t_pos: torch.Tensor, table_mode: str, flush: str):
    """Candidate model of ex2 on the argument z (float32), returns float32.

    |z| -> Q = floor(|z| * 2**23) (fixed point, truncated), I = Q >> 23, F = Q mod 2**23.
    table_mode 'pos_table': z < 0 -> T_neg[F] * 2**-I, z >= 0 -> T_pos[F] * 2**I;
               'neg_table': z < 0 as above, z >= 0 -> T_neg[k] * 2**n with n = ceil(Q / 2**23), k = n 2**23 - Q.
    t_neg/t_pos: float32 tables of length 2**23 + 1 (entry 2**23 is f(-1) / f(1)). flush: 'after', 'exact',
    'none' (see f64_to_f32_ftz) or 'halfsq' (z < -126: the model at z/2, squared in float32).
    """
    neg = torch.signbit(z)
    za = torch.nan_to_num(z.abs(), nan=0.0, posinf=256.0).clamp(max=256.0)
    Q = torch.floor(za.to(torch.float64) * float(NGRID)).to(torch.int64)
    I_ = Q >> GRID_BITS
    F = Q & (NGRID - 1)
    vneg = tu.ldexp_exact(t_neg[F], -I_)
    if table_mode == "pos_table":
        vpos = tu.ldexp_exact(t_pos[F], I_)
    else:
        n = (Q + NGRID - 1) >> GRID_BITS
        k = n * NGRID - Q
        vpos = tu.ldexp_exact(t_neg[k], n)
    v = torch.where(neg, vneg, vpos)
    if flush == "halfsq":
        # non-ftz ex2 done as: z < -126 -> ex2(z * 0.5) squared in float32 (RN, subnormals kept)
        out = tu.f64_to_f32_ftz(v, "none")
        small = z < -126
        if bool(small.any()):
            h = table_lookup_model(z * 0.5, t_neg, t_pos, table_mode, "none").to(torch.float64)
            out = torch.where(small, (h * h).to(torch.float32), out)
    else:
        out = tu.f64_to_f32_ftz(v, flush)
    return torch.where(torch.isnan(z), torch.full_like(out, float("nan")), out)


MODEL_VARIANTS = [(tm, fl) for tm in ("pos_table", "neg_table") for fl in ("after", "exact", "none")] + [
    ("pos_table", "halfsq")
]


def _eq_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bitwise equality of float32 tensors, any NaN equal to any NaN."""
    return (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))


# ----------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------
def build_tables(be, fn: str, device) -> dict:
    """T_neg[k] = fn(-k 2**-23), T_pos[k] = fn(k 2**-23), k = 0..2**23 (both ends included)."""
    k = torch.arange(0, NGRID + 1, device=device, dtype=torch.float64)
    g_pos = (k / NGRID).to(torch.float32)
    g_neg = -g_pos
    out = {}
    for side, g in (("neg", g_neg), ("pos", g_pos)):
        t = be.run(fn, g)
        r64, r32 = reference("exp2", g)
        near = tu.near_midpoint(r64, r32)
        delta = tu.u32(t) - tu.u32(r32)
        out[side] = {"t": t, "ref": r32, "near": near, "delta": delta}
    return out


def table_arrays_and_summary(tables: dict, prefix: str) -> tuple[dict, dict]:
    arrays, summ = {}, {}
    for side, d in tables.items():
        delta = d["delta"][:NGRID].cpu().numpy()
        dtype = np.int8 if delta.min() >= -128 and delta.max() <= 127 else np.int16
        arrays[f"{prefix}_table_{side}_delta"] = delta.astype(dtype)
        near_idx = torch.nonzero(d["near"][:NGRID]).flatten()
        arrays[f"{prefix}_table_{side}_near_idx"] = near_idx.cpu().numpy().astype(np.int32)
        arrays[f"{prefix}_table_{side}_bits_at_near"] = tu.to_numpy_u32(d["t"][near_idx])
        h = Hist(clip=64)
        h.add_values(delta)
        tbits = tu.to_numpy_u32(d["t"][:NGRID])
        summ[side] = {
            "entries": NGRID,
            "grid": f"{'-' if side == 'neg' else ''}k*2^-23, k=0..2^23-1",
            "delta_dtype": np.dtype(dtype).name,
            "delta_hist": h.to_json(),
            "reference_near_midpoint": int(near_idx.numel()),
            "sha256_table_bits": hashlib.sha256(tbits.tobytes()).hexdigest(),
            "value_at_k_2^23": hexbits(int(tu.u32(d["t"][NGRID]))),
        }
    return arrays, summ


# ----------------------------------------------------------------------------------------------------------
# One function over many chunks
# ----------------------------------------------------------------------------------------------------------
class FnStats:
    def __init__(self, fn: str, variants) -> None:
        self.fn = fn
        self.classes: dict[str, int] = {}
        # 2*1024+1 int64 bins fit a CUDA shared-memory histogram (no global-atomic contention on the 0 bin)
        self.hist_main = Hist(clip=1024)
        self.hist_near = Hist(clip=1024)
        self.hist_all = Hist(clip=1024)
        self.model = {
            f"{tm}/{fl}": {"mismatch": 0, "mismatch_neg": 0, "mismatch_pos": 0, "first": []} for tm, fl in variants
        }
        self.quant = {
            side: {q: 0 for q in ("trunc", "round", "floor")} | {"tested": 0} for side in ("neg_unit", "pos_unit")
        }
        self.rr = {
            f"{sign}_{how}": {"tested": 0, "violations": 0, "not_representable": 0, "first": []}
            for sign in ("neg", "pos")
            for how in ("ceil", "floor")
        }
        self.asm_check = {"compared": 0, "mismatch": 0, "first": []}
        self.nan_out_bits: dict[str, int] = {}
        self.det = {"chunks_rerun": 0, "chunks_differing": 0, "elements_differing": 0}
        self.chunks_done = 0
        self.binade = {
            "covered": np.zeros(512, dtype=bool),
            "distinct": np.zeros(512, dtype=np.int64),
            "cells": np.zeros(512, dtype=np.int64),
            "cell_viol": np.zeros(512, dtype=np.int64),
            "constgroup_viol": np.zeros((512, GRID_BITS + 1), dtype=np.int64),
            "n_main": np.zeros(512, dtype=np.int64),
            "n_diff_nonzero": np.zeros(512, dtype=np.int64),
            "diff_min": np.zeros(512, dtype=np.int64),
            "diff_max": np.zeros(512, dtype=np.int64),
            "model_mismatch": np.zeros((512, len(MODEL_VARIANTS)), dtype=np.int64),
        }

    def add(self, key: str, n) -> None:
        self.classes[key] = self.classes.get(key, 0) + int(n)


def _first_records(mask, k, cols: dict) -> list:
    idx = tu.first_true(mask, k)
    out = []
    for i in idx.tolist():
        out.append({name: hexbits(int(tu.u32(v[i : i + 1])[0])) for name, v in cols.items()})
    return out


def process_chunk(be, fn: str, start: int, size: int, st: FnStats, tabs: dict, log2e, keep_first=8):
    dev = tabs["neg"]["t"].device
    bits = tu.bit_range(start, size, dev)
    x = bits.view(torch.float32)
    out = be.run(fn, x)
    out2 = be.run(fn, x)
    ndiff = int((out.view(torch.int32) != out2.view(torch.int32)).sum())
    del out2
    st.det["chunks_rerun"] += 1
    st.det["chunks_differing"] += int(ndiff > 0)
    st.det["elements_differing"] += ndiff

    r64, r32 = reference(fn, x)
    near = tu.near_midpoint(r64, r32)
    ob = tu.u32(out)
    diff = out.view(torch.int32).to(torch.int64) - r32.view(torch.int32).to(torch.int64)
    nan_in = torch.isnan(x)
    out_nan, ref_nan = torch.isnan(out), torch.isnan(r32)
    out_inf, ref_inf = torch.isinf(out), torch.isinf(r32)
    out_zero, ref_zero = out == 0, r32 == 0
    tiny = 2.0**-126
    ref_sub = ~ref_zero & (r32.abs() < tiny)
    out_sub = ~out_zero & (out.abs() < tiny)
    fin = torch.isfinite(out) & torch.isfinite(r32)
    same_sign = torch.signbit(out) == torch.signbit(r32)
    flushed = ref_sub & out_zero
    elig = fin & same_sign
    main = elig & ~flushed & ~near
    counts = {
        "inputs": size,
        "nan_in": nan_in.sum(),
        "nan_in_nan_out": (nan_in & out_nan).sum(),
        "nan_out_non_nan_ref": (out_nan & ~ref_nan).sum(),
        "ref_inf": ref_inf.sum(),
        "ref_inf_out_inf_same_sign": (ref_inf & out_inf & same_sign).sum(),
        "ref_inf_out_finite": (ref_inf & torch.isfinite(out)).sum(),
        "out_inf_ref_finite": (out_inf & torch.isfinite(r32)).sum(),
        "ref_zero": ref_zero.sum(),
        "ref_zero_out_nonzero": (ref_zero & ~out_zero & ~out_nan).sum(),
        "ref_subnormal": ref_sub.sum(),
        "flushed_subnormal": flushed.sum(),
        "ref_subnormal_out_subnormal": (ref_sub & out_sub).sum(),
        "out_subnormal": out_sub.sum(),
        "sign_mismatch_finite": (fin & ~same_sign).sum(),
        "near_midpoint": near.sum(),
        "near_midpoint_eligible": (near & elig & ~flushed).sum(),
        "main": main.sum(),
    }
    for k, v in counts.items():
        st.add(k, v)
    if bool(nan_in.any()):
        u, c = torch.unique(ob[nan_in & out_nan], return_counts=True)
        for uu, cc in zip(u.tolist()[:8], c.tolist()[:8], strict=True):
            st.nan_out_bits[hexbits(uu)] = st.nan_out_bits.get(hexbits(uu), 0) + cc
    tu.hist_add(st.hist_main, diff, main)
    tu.hist_add(st.hist_near, diff, near & elig & ~flushed)
    tu.hist_add(st.hist_all, diff, elig)
    # ex2 argument
    z = x if fn == "exp2" else x * log2e
    # direct check against the raw instruction
    asm_fn = "ex2_ftz_asm" if fn == "exp2" else "ex2_asm"
    if be.available(asm_fn):
        try:
            ya = be.run(asm_fn, z)
            mm = ~_eq_bits(out, ya)
            st.asm_check["compared"] += size
            st.asm_check["mismatch"] += int(mm.sum())
            if len(st.asm_check["first"]) < keep_first and bool(mm.any()):
                n_more = keep_first - len(st.asm_check["first"])
                st.asm_check["first"] += _first_records(mm, n_more, {"x": x, "z": z, "out": out, "asm": ya})
        except Exception:  # noqa: BLE001 - availability recorded by the backend
            pass
    # quantisation of the fraction, in (-1, 0) and [0, 1)
    tn, tp = tabs["neg"]["t"], tabs["pos"]["t"]
    zd = z.to(torch.float64)
    zb = tu.u32(z)
    for side, lo, hi, tab, sgn in (
        ("neg_unit", 0x80000001, 0xBF7FFFFF, tn, -1.0),
        ("pos_unit", 0, 0x3F7FFFFF, tp, 1.0),
    ):
        m = (zb >= lo) & (zb <= hi)
        if not bool(m.any()):
            continue
        s = zd[m] * sgn * NGRID
        ob_m = ob[m]
        st.quant[side]["tested"] += int(m.sum())
        for q, kk in (("trunc", torch.floor(s)), ("round", torch.round(s)), ("floor", torch.ceil(s))):
            ki = kk.to(torch.int64).clamp(0, NGRID)
            st.quant[side][q] += int((tu.u32(tab[ki]) != ob_m).sum())
    # range reduction identities
    finz = torch.isfinite(z)
    ftz = "after" if fn == "exp2" else "none"
    ex2_for_f = "exp2" if fn == "exp2" else ("ex2_asm" if be.available("ex2_asm") else None)
    if ex2_for_f is not None:
        for how in ("ceil", "floor"):
            nn = torch.ceil(zd) if how == "ceil" else torch.floor(zd)
            f64 = torch.where(finz, zd - nn, torch.zeros_like(zd))
            f32 = f64.to(torch.float32)
            rep = f32.to(torch.float64) == f64
            try:
                yf = be.run(ex2_for_f, f32)
            except Exception:  # noqa: BLE001
                break
            cand = tu.f64_to_f32_ftz(tu.ldexp_exact(yf, torch.where(finz, nn, 0.0).clamp(-2000, 2000)), ftz)
            viol = ~_eq_bits(cand, out)
            for sign, sm in (("neg", torch.signbit(z)), ("pos", ~torch.signbit(z))):
                key = f"{sign}_{how}"
                tested = finz & sm & rep
                v = viol & tested
                st.rr[key]["tested"] += int(tested.sum())
                st.rr[key]["violations"] += int(v.sum())
                st.rr[key]["not_representable"] += int((finz & sm & ~rep).sum())
                if len(st.rr[key]["first"]) < keep_first and bool(v.any()):
                    st.rr[key]["first"] += _first_records(
                        v,
                        keep_first - len(st.rr[key]["first"]),
                        {"x": x, "z": z, "out": out, "f": f32, "ex2_f": yf, "candidate": cand},
                    )
    # the table model
    variant_mm = {}
    for tm, fl in MODEL_VARIANTS:
        key = f"{tm}/{fl}"
        if key not in st.model:
            continue
        mo = table_lookup_model(z, tn, tp, tm, fl)
        mm = ~_eq_bits(mo, out)
        rec = st.model[key]
        rec["mismatch"] += int(mm.sum())
        rec["mismatch_neg"] += int((mm & torch.signbit(z)).sum())
        rec["mismatch_pos"] += int((mm & ~torch.signbit(z)).sum())
        if len(rec["first"]) < keep_first and bool(mm.any()):
            rec["first"] += _first_records(
                mm, keep_first - len(rec["first"]), {"x": x, "z": z, "out": out, "model": mo}
            )
        variant_mm[key] = mm
    # per binade (only for whole binades)
    if size % NGRID == 0 and start % NGRID == 0:
        nb = size // NGRID
        b0 = (start >> GRID_BITS) & 0x1FF
        sl = slice(b0, b0 + nb)
        B = st.binade
        B["covered"][sl] = True
        obb = out.view(torch.int32).view(nb, NGRID)
        srt = torch.sort(obb, dim=1).values
        B["distinct"][sl] = ((srt[:, 1:] != srt[:, :-1]).sum(1) + 1).cpu().numpy()
        del srt
        if fn == "exp2":
            xa = torch.nan_to_num(x.abs(), nan=0.0, posinf=256.0).clamp(max=256.0)
            Q = torch.floor(xa.to(torch.float64) * NGRID).to(torch.int64).view(nb, NGRID)
            B["cells"][sl] = ((Q[:, 1:] != Q[:, :-1]).sum(1) + 1).cpu().numpy()
            B["cell_viol"][sl] = ((Q[:, 1:] == Q[:, :-1]) & (obb[:, 1:] != obb[:, :-1])).sum(1).cpu().numpy()
            del Q
        eq = torch.ones((nb, NGRID), dtype=torch.bool, device=dev)
        rep = obb
        for s_ in range(1, GRID_BITS + 1):
            eq = eq[:, 0::2] & eq[:, 1::2] & (rep[:, 0::2] == rep[:, 1::2])
            rep = rep[:, 0::2]
            B["constgroup_viol"][sl, s_] = (~eq).sum(1).cpu().numpy()
        mb = main.view(nb, NGRID)
        db = diff.view(nb, NGRID)
        B["n_main"][sl] = mb.sum(1).cpu().numpy()
        B["n_diff_nonzero"][sl] = (mb & (db != 0)).sum(1).cpu().numpy()
        big = 1 << 40
        B["diff_min"][sl] = torch.where(mb, db, big).min(1).values.cpu().numpy()
        B["diff_max"][sl] = torch.where(mb, db, -big).max(1).values.cpu().numpy()
        for vi, (tm, fl) in enumerate(MODEL_VARIANTS):
            mm = variant_mm.get(f"{tm}/{fl}")
            if mm is not None:
                B["model_mismatch"][sl, vi] = mm.view(nb, NGRID).sum(1).cpu().numpy()
    return out


def _sha256_pieces(pieces: list) -> str:
    h = hashlib.sha256()
    for p in pieces:
        h.update(p)
    return h.hexdigest()


def binade_label(b: int) -> str:
    sign = "-" if b >= 256 else "+"
    e = b & 0xFF
    if e == 0:
        return f"{sign}subnormal"
    if e == 255:
        return f"{sign}inf/nan"
    return f"{sign}[2^{e - 127},2^{e - 126})"


def summarize_binades(B: dict, small_only: bool) -> list:
    """Rows [binade, distinct_outputs, grid_cells, cell_violations, max_s_constant] for |x| < 2**-2."""
    rows = []
    for b in range(512):
        if not B["covered"][b]:
            continue
        e = b & 0xFF
        if small_only and not (e <= 124):
            continue
        viol = B["constgroup_viol"][b]
        smax = 0
        for s in range(1, GRID_BITS + 1):
            if viol[s] == 0:
                smax = s
            else:
                break
        rows.append([binade_label(b), int(B["distinct"][b]), int(B["cells"][b]), int(B["cell_viol"][b]), smax])
    return rows


def default_chunks(quick: bool) -> tuple[int, list[int]]:
    if not quick:
        return 28, [i << 28 for i in range(16)]
    starts = [0x3F000000, 0xBF000000, 0x3E000000, 0xBE000000, 0x00000000, 0x42800000, 0xC2800000, 0xFF800000]
    return 23, starts


def run(ctx) -> dict:
    dev = ctx.device
    be = ctx.backend or TritonExp2Backend()
    params = getattr(ctx, "params", {}) or {}
    chunk_bits, starts = default_chunks(ctx.quick)
    chunk_bits = params.get("exp2_chunk_bits", chunk_bits)
    starts = params.get("exp2_chunk_starts", starts)
    size = 1 << chunk_bits
    piece = min(size, 1 << params.get("exp2_piece_bits", 26))  # launch/analysis granularity (GPU memory)
    # process the chunks holding (-1, 0) and [0, 1) first so that a time-out still leaves the table evidence
    order = sorted(starts, key=lambda s: (0 if (s >> 30) in (0, 2) else 1, s))
    result: dict = {
        "chunk_bits": chunk_bits,
        "piece_bits": piece.bit_length() - 1,
        "chunks": len(starts),
        "inputs_per_function": len(starts) * size,
    }
    arrays: dict = {}
    ctx.log(f"exp2: building tables (2^{GRID_BITS}+1 grid points per side) on {dev}")
    tabs = build_tables(be, "exp2", dev)
    ta, tsum = table_arrays_and_summary(tabs, "exp2")
    arrays.update(ta)
    result["table"] = tsum
    # tables of the raw non-ftz instruction, for comparison
    try:
        t2 = build_tables(be, "ex2_asm", dev)
        result["table_ex2_asm_vs_exp2"] = {
            side: int((tu.u32(t2[side]["t"]) != tu.u32(tabs[side]["t"])).sum()) for side in ("neg", "pos")
        }
        del t2
    except Exception as e:  # noqa: BLE001
        result["table_ex2_asm_vs_exp2"] = {"error": repr(e)[:300]}
    # log2e as compiled
    be.run("exp", torch.zeros(16, device=dev))
    consts = ptx_constants(getattr(be, "ptx", {}).get("exp"), "mul")
    c_bits = LOG2E_F32_BITS
    if consts:
        c_bits = int(consts[0][2:], 16)
    result["exp_log2e_constant"] = {"from_ptx": consts, "used": hexbits(c_bits), "value": bits_f32(c_bits)}
    log2e = torch.tensor(bits_f32(c_bits), dtype=torch.float32, device=dev)
    ctx.checkpoint({"partial": True, **result})

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    pending: list = []
    funcs = {}
    for fn in ("exp2", "exp"):
        st = FnStats(fn, MODEL_VARIANTS)
        funcs[fn] = st
        t0 = time.monotonic()
        done = 0
        for start in order:
            if ctx.time_left() < 20:
                ctx.log(f"exp2: {fn}: stopping early, time budget nearly spent ({done} chunks done)")
                break
            hosts = []
            for pstart in range(start, start + size, piece):
                out = process_chunk(be, fn, pstart, min(piece, size), st, tabs, log2e)
                hosts.append(out.view(torch.int32).cpu().numpy())
                del out
            pending.append((fn, hexbits(start), pool.submit(_sha256_pieces, hosts)))
            while sum(1 for p in pending if not p[2].done()) > 3:
                time.sleep(0.02)
            done += 1
            if done % 4 == 0 or done == len(order):
                ctx.log(f"exp2: {fn}: {done}/{len(order)} chunks, {time.monotonic() - t0:.1f}s")
        st.chunks_done = done
    hashes: dict = {fn: {} for fn in funcs}
    for fn, key, fut in pending:
        hashes[fn][key] = fut.result()
    pool.shutdown()
    for fn, st in funcs.items():
        ordered = dict(sorted(hashes[fn].items()))
        combined = hashlib.sha256("".join(ordered.values()).encode()).hexdigest()
        best = min(st.model.items(), key=lambda kv: kv[1]["mismatch"])
        res = {
            "chunks_done": st.chunks_done,
            "classes": st.classes,
            "nan_output_bits": st.nan_out_bits,
            "hist_main": st.hist_main.to_json(),
            "hist_near_midpoint": st.hist_near.to_json(),
            "hist_all_same_sign": st.hist_all.to_json(),
            "deterministic": st.det,
            "sha256_chunks": ordered,
            "sha256_of_chunk_digests": combined,
            "direct_check_vs_raw_instruction": st.asm_check,
            "quantization": st.quant,
            "range_reduction": st.rr,
            "model": {
                "variants": st.model,
                "variant_order": [f"{tm}/{fl}" for tm, fl in MODEL_VARIANTS],
                "best": best[0],
                "best_mismatch": best[1]["mismatch"],
            },
            "evidence": getattr(be, "evidence", {}).get(fn, {"unavailable": True}),
        }
        if fn == "exp2":
            res["small_x_binades"] = {
                "columns": ["binade", "distinct_outputs", "grid_cells_2^-23", "cell_violations", "max_s_constant"],
                "rows": summarize_binades(st.binade, small_only=True),
            }
        res["binades_all"] = {
            "columns": ["binade", "distinct_outputs", "grid_cells_2^-23", "cell_violations", "max_s_constant"],
            "rows": summarize_binades(st.binade, small_only=False) if ctx.quick else "see npz",
        }
        result[fn] = res
        for k, v in st.binade.items():
            arrays[f"{fn}_binade_{k}"] = v
    result["evidence_raw_instructions"] = {k: v for k, v in getattr(be, "evidence", {}).items() if k.endswith("asm")}
    result["backend_failures"] = getattr(be, "failed", {})
    np.savez_compressed(ctx.out / "exp2.npz", **arrays)
    result["npz"] = "exp2.npz"
    e2 = result.get("exp2", {})
    ex = result.get("exp", {})
    result["summary"] = {
        "exp2_model_mismatch": f"{e2.get('model', {}).get('best_mismatch')} ({e2.get('model', {}).get('best')})",
        "exp_model_mismatch": f"{ex.get('model', {}).get('best_mismatch')} ({ex.get('model', {}).get('best')})",
        "exp2_ulp": _hist_line(e2.get("hist_main")),
        "exp2_flushed": e2.get("classes", {}).get("flushed_subnormal"),
        "deterministic": all(r.get("deterministic", {}).get("chunks_differing", 1) == 0 for r in (e2, ex) if r),
    }
    return result


def _hist_line(h: dict | None) -> str:
    if not h:
        return "n/a"
    from .common import hist_summary

    return hist_summary(h)
