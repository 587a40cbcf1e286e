"""Hold emufloat's hardware models against the GPU, at scale, in one call.

    OUT=/path bash studies/device/run_verify.sh          # python -m studies.device.verify_models --out $OUT

Runs on a machine with a CUDA GPU, torch and triton; the models run on its CPU cores. Sections (each with
its own time check; a failure is recorded and the next section runs):

* `rcp`       — reads the `rcp.approx.ftz.f32` table off the GPU (2**23 significands), writes it as
                  emufloat package data (`rcp.npz` in $OUT, and into emufloat/hw/h100/data of this tree).
* `cases`     — recorded cases for the CPU tests: 2**17 seeded random bit patterns plus edge values through
                  tl.math.exp2, tl.exp, ex2.approx.f32, rcp.approx.ftz.f32 and fp32 `/` (`functions.npz`).
* `sweep`     — all 2**32 inputs of tl.math.exp2, tl.exp, ex2.approx.f32 and rcp.approx.ftz.f32 against
                  emufloat, plus a weighted checksum per 2**27 chunk of the GPU's output bits (so the models
                  can be re-checked exhaustively on a CPU: tools/check_functions_exhaustive.py).
* `div`       — fp32 `/` (div.full.f32) against `emufloat.hw.h100.div_full`: 2**30 random pairs from
                  several populations, the special/boundary pairs, and every b for two values of a.
* `dot`       — tl.dot on 64x64xK stress tiles (studies.probes.mma_cases generators) against the emufloat
                  presets, >= 10**7 dot products per input type; FP8 with max_num_imprecise_acc=32 too.
* `tf32`      — tl.dot(input_precision="tf32") on fp32 tiles against candidate models; tiles saved.
* `reduction` — tl.sum / tl.max of fp32 rows against emufloat.hw.h100.tl_sum: the recorded tiles and, by the
                  layout rules (derived_tl_sum), tiles of 16 to 256 columns.
* `libdevice` — `tl.math.log2` (libdevice's log2f) against `emufloat.hw.libdevice.log2f`: seeded random
                  and edge inputs kept (`libdevice.npz`), then all 2**32 inputs with a checksum per chunk.

Writes `verify.json` (after every section) and the npz files named above to $OUT.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import numpy as np

try:
    import torch
    import triton
    import triton.language as tl
except ImportError as exc:  # one line when run, an ImportError when imported, without the gpu extra
    from gpu.commands import missing_extra

    raise missing_extra("studies.device.verify_models", __name__, exc) from None

import emufloat as ef
from emufloat.hw import calibration, h100, libdevice
from flashsim.console import ArgumentParser, run_command, writable_dir
from gpu.commands import json_params, positive, require_gpu, sections
from studies.probes import torchutil as tu
from studies.probes.common import jsonable

BLOCK = 1024
CHUNK = 1 << 27
MASK64 = (1 << 64) - 1


# ---- kernels ---------------------------------------------------------------------------
@triton.jit
def _unary_kernel(x_ptr, y_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if FN == 0:
        y = tl.math.exp2(x)
    elif FN == 1:
        y = tl.exp(x)
    elif FN == 4:
        y = tl.math.log2(x)
    elif FN == 2:
        y = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y, mask=m)


@triton.jit
def _div_kernel(a_ptr, b_ptr, q_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=1.0)
    b = tl.load(b_ptr + offs, mask=m, other=1.0)
    tl.store(q_ptr + offs, a / b, mask=m)


@triton.jit
def _tf32_kernel(a_ptr, b_ptr, c_ptr, d_ptr, K: tl.constexpr, HAS_C: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    rm = tl.arange(0, 64)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + t * 64 * K + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + t * K * 64 + rk[:, None] * 64 + rm[None, :])
    if HAS_C:
        c = tl.load(c_ptr + t * 4096 + rm[:, None] * 64 + rm[None, :])
        d = tl.dot(a, b, c, input_precision="tf32")
    else:
        d = tl.dot(a, b, input_precision="tf32")
    tl.store(d_ptr + t * 4096 + rm[:, None] * 64 + rm[None, :], d)


UNARY = {"exp2": 0, "exp": 1, "ex2_nonftz": 2, "rcp": 3}
LIBDEVICE = {"log2": 4}  # libdevice functions (emufloat.hw.libdevice): the same on every NVIDIA GPU
MODELS = {
    "exp2": h100.triton_exp2,
    "exp": h100.triton_exp,
    "ex2_nonftz": lambda x: h100.ex2_approx(x, ftz=False),
    "rcp": h100.rcp_approx,
    "log2": libdevice.log2f,
}


def gpu_unary(name: str, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    _unary_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, FN=(UNARY | LIBDEVICE)[name], BLOCK=BLOCK)
    return y


def gpu_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    q = torch.empty_like(a)
    n = a.numel()
    _div_kernel[(triton.cdiv(n, BLOCK),)](a, b, q, n, BLOCK=BLOCK)
    return q


# ---- comparison helpers ----------------------------------------------------------------
class Tally:
    """Bitwise comparison counts, with NaN-vs-NaN payload differences counted apart, and first examples."""

    def __init__(self, keep: int = 32) -> None:
        self.compared = 0
        self.mismatch = 0
        self.nan_payload_only = 0
        self.first: list = []
        self.keep = keep

    def add(self, gpu: np.ndarray, model: np.ndarray, *inputs: np.ndarray) -> np.ndarray:
        g = gpu.reshape(-1).view(np.uint32)
        m = model.reshape(-1).view(np.uint32)
        diff = g != m
        gn = (g & 0x7FFFFFFF) > 0x7F800000
        mn = (m & 0x7FFFFFFF) > 0x7F800000
        self.compared += g.size
        self.nan_payload_only += int(np.count_nonzero(diff & gn & mn))
        self.mismatch += int(np.count_nonzero(diff))
        if diff.any() and len(self.first) < self.keep:
            for i in np.flatnonzero(diff)[: self.keep - len(self.first)]:
                self.first.append(
                    [f"0x{int(np.asarray(x).reshape(-1).view(np.uint32)[i]):08x}" for x in inputs]
                    + [f"gpu=0x{int(g[i]):08x}", f"model=0x{int(m[i]):08x}"]
                )
        return diff

    def json(self) -> dict:
        return {
            "compared": self.compared,
            "mismatch": self.mismatch,
            "nan_payload_only": self.nan_payload_only,
            "first": self.first,
        }


def weighted_checksum(bits_i32: torch.Tensor, start: int) -> int:
    """sum_i bits[i] * (2 * (start + i) + 1) mod 2**64 (any single changed word changes it)."""
    idx = torch.arange(start, start + bits_i32.numel(), device=bits_i32.device, dtype=torch.int64)
    w = idx * 2 + 1
    v = bits_i32.to(torch.int64) & 0xFFFFFFFF
    return int((v * w).sum().item()) & MASK64  # int64 arithmetic wraps modulo 2**64


def to_np_bits(x: torch.Tensor) -> np.ndarray:
    return x.view(torch.int32).cpu().numpy().view(np.uint32)


# ---- sections --------------------------------------------------------------------------
def section_rcp(ctx) -> dict:
    dev = ctx.device
    mant = torch.arange(1 << 23, device=dev, dtype=torch.int64) | (127 << 23)
    m = tu.bits_to_f32(mant)
    r = to_np_bits(gpu_unary("rcp", m))
    cr = h100.grid_rcp()
    delta = r.astype(np.int64) - cr.astype(np.int64)
    hist = {int(k): int(v) for k, v in zip(*np.unique(delta, return_counts=True), strict=False)}
    if delta.min() < -128 or delta.max() > 127:
        raise RuntimeError(f"rcp deltas outside int8: {delta.min()}..{delta.max()}")
    sha = calibration.digest(r)
    np.savez_compressed(ctx.out / "rcp.npz", rcp_table_delta=delta.astype(np.int8), rcp_table_sha256=np.array(sha))
    # into this tree's package data, so the models below use it (tools/build_package_data.py does it at home)
    arrays = {
        "delta": delta.astype(np.int8),
        "sha256": np.array(sha),
        "source": np.array("studies/device/verify_models.py"),
    }
    np.savez_compressed(h100.DATA.path_of("rcp"), **arrays)
    h100.rcp_table.cache_clear()
    h100.rcp_table()
    return {"delta_hist_vs_correctly_rounded": hist, "sha256_table_bits": sha, "value_at_1": f"0x{int(r[0]):08x}"}


def edge_bits() -> np.ndarray:
    """Bit patterns of special and boundary float32 values (both signs)."""
    vals = []
    for e in range(256):
        for f in (0, 1, 2, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF):
            vals.append((e << 23) | f)
    for x in (1.0, 126.0, 126.5, 127.0, 127.99999, 128.0, 149.0, 150.0, 252.0, 256.0, 0.5, 88.72, 87.33, 103.97):
        b = int(np.float32(x).view(np.uint32))
        vals += [b - 1, b, b + 1]
    v = np.array(vals, dtype=np.uint64) & 0x7FFFFFFF
    return np.unique(np.concatenate([v, v | 0x80000000]).astype(np.uint32))


def unary_cases(ctx, names, rng, n: int = 1 << 17) -> tuple[dict, dict]:
    """`n` random bit patterns from `rng` and the edge values through each unary function of `names` on
    the GPU and against its model: (arrays to keep: x and <name>_out, tallies by name)."""
    x = np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), edge_bits()])
    xt = torch.from_numpy(x.view(np.int32)).to(ctx.device).view(torch.float32)
    out, res = {"x": x}, {}
    for name in names:
        g = to_np_bits(gpu_unary(name, xt))
        out[f"{name}_out"] = g
        t = Tally()
        t.add(g, np.asarray(MODELS[name](x.view(np.float32))), x)
        res[name] = t.json()
    return out, res


def section_cases(ctx) -> dict:
    rng = np.random.default_rng(ctx.seed)
    n = 1 << 17
    out, res = unary_cases(ctx, UNARY, rng, n)
    # division: random bits, random moderate exponents, and the probe's special pairs
    from studies.probes.inputs import special_pairs

    a = np.concatenate(
        [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), special_pairs()[0].view(np.uint32)]
    )
    b = np.concatenate(
        [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), special_pairs()[1].view(np.uint32)]
    )
    q = to_np_bits(gpu_div(*(torch.from_numpy(v.view(np.int32)).to(ctx.device).view(torch.float32) for v in (a, b))))
    out.update(div_a=a, div_b=b, div_out=q)
    t = Tally()
    t.add(q, h100.div_full(a.view(np.float32), b.view(np.float32)), a, b)
    res["div"] = t.json()
    np.savez_compressed(ctx.out / "functions.npz", seed=np.array(ctx.seed), **out)
    res["file"] = "functions.npz"
    return res


def section_sweep(ctx, names=tuple(UNARY)) -> dict:
    res = {}
    for name in names:
        t = Tally()
        sums = []
        t0 = time.monotonic()
        for start in range(0, 1 << 32, CHUNK):
            if ctx.out_of_time():
                res["stopped_early"] = True
                break
            bits = tu.bit_range(start, CHUNK, ctx.device)
            y = gpu_unary(name, bits.view(torch.float32)).view(torch.int32)
            sums.append(f"{weighted_checksum(y, start):016x}")
            g = y.cpu().numpy().view(np.uint32)
            x = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32)
            t.add(g, np.asarray(MODELS[name](x.view(np.float32))), x)
        res[name] = t.json() | {"chunk": CHUNK, "checksums": sums, "seconds": round(time.monotonic() - t0, 1)}
        ctx.log(f"sweep {name}: {t.compared} compared, {t.mismatch} mismatches")
    return res


def section_div(ctx) -> dict:
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(ctx.seed)
    res = {}
    per = 1 << 26
    total = Tally()
    pops = {}
    kinds = ("random_bits", "moderate", "b_huge", "b_tiny", "a_tiny", "q_overflow", "q_underflow")
    for _rep in range(16):
        for kind in kinds:
            if ctx.out_of_time():
                res["stopped_early"] = True
                break
            a, b = div_population(kind, per // len(kinds), gen, ctx.device)
            q = gpu_div(a, b)
            an, bn, qn = to_np_bits(a), to_np_bits(b), to_np_bits(q)
            before = total.mismatch
            total.add(qn, h100.div_full(an.view(np.float32), bn.view(np.float32)), an, bn)
            pops.setdefault(kind, [0, 0])
            pops[kind][0] += an.size
            pops[kind][1] += total.mismatch - before
    res["random"] = total.json() | {"per_population": pops}
    from studies.probes.inputs import special_pairs

    a, b, _ = special_pairs()
    q = to_np_bits(gpu_div(torch.from_numpy(a).to(ctx.device), torch.from_numpy(b).to(ctx.device)))
    t = Tally()
    t.add(q, h100.div_full(a, b), a.view(np.uint32), b.view(np.uint32))
    res["special_pairs"] = t.json()
    for aval in (1.0, float(np.float32(-1.7) * np.float32(2.0**-100))):
        t = Tally()
        for start in range(0, 1 << 32, CHUNK):
            if ctx.out_of_time():
                res["stopped_early"] = True
                break
            bb = tu.bit_range(start, CHUNK, ctx.device).view(torch.float32)
            aa = torch.full_like(bb, aval)
            q = to_np_bits(gpu_div(aa, bb))
            x = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32)
            t.add(q, h100.div_full(np.float32(aval), x.view(np.float32)), x)
        res[f"all_b_for_a={aval!r}"] = t.json()
    return res


def div_population(kind: str, n: int, gen, dev) -> tuple[torch.Tensor, torch.Tensor]:
    def bits(elo: int, ehi: int) -> torch.Tensor:
        r = torch.randint(0, 2**32, (n,), generator=gen, device=dev, dtype=torch.int64)
        e = torch.randint(elo, ehi + 1, (n,), generator=gen, device=dev, dtype=torch.int64)
        return tu.bits_to_f32((r & 0x807FFFFF) | (e << 23))

    if kind == "random_bits":
        r = torch.randint(0, 2**32, (2, n), generator=gen, device=dev, dtype=torch.int64)
        return tu.bits_to_f32(r[0]), tu.bits_to_f32(r[1])
    if kind == "moderate":
        return bits(117, 137), bits(117, 137)
    if kind == "b_huge":
        return bits(1, 254), bits(250, 254)
    if kind == "b_tiny":
        return bits(1, 254), bits(0, 3)
    if kind == "a_tiny":
        return bits(0, 3), bits(100, 160)
    if kind == "q_overflow":
        return bits(200, 254), bits(0, 60)
    return bits(0, 60), bits(200, 254)  # q_underflow


DOT_TYPES = {  # name: (probe format, emufloat preset, ml_dtypes dtype name, K values)
    "bf16": ("bf16", "h100_wgmma_bf16", "bfloat16", (16, 32, 64, 128, 256)),
    "fp16": ("fp16", "h100_wgmma_fp16", "float16", (16, 32, 64, 128, 256)),
    "e4m3": ("e4m3", "h100_wgmma_fp8", "float8_e4m3fn", (32, 64, 128, 256)),
    "e5m2": ("e5m2", "h100_wgmma_fp8", "float8_e5m2", (32, 64, 128, 256)),
}


def section_dot(ctx) -> dict:
    import ml_dtypes

    from studies.probes import mma_cases as mc
    from studies.probes.formats import FORMATS
    from studies.probes.mma import TritonDotBackend

    be = TritonDotBackend()
    rng = np.random.default_rng(ctx.seed + 1)
    res = {}
    target = ctx.params.get("dots_per_type", 10_000_000)
    batch = 32
    keep = {}
    for name, (fname, preset, npdt, ks) in DOT_TYPES.items():
        fmt = FORMATS[fname]
        dtype = np.dtype(getattr(ml_dtypes, npdt)) if npdt != "float16" else np.dtype(np.float16)
        model = h100.PRESETS[preset]
        iview = np.int16 if dtype.itemsize == 2 else np.int8
        uview = np.uint16 if dtype.itemsize == 2 else np.uint8
        tdt = getattr(torch, fmt.torch_dtype)
        combos = [(k, hc) for k in ks for hc in (False, True)]
        tiles_per_combo = -(-target // (4096 * len(combos)))
        st = {"dots": 0, "per_combo": {}}
        tal = Tally()
        t0 = time.monotonic()
        for k, hc in combos:
            done = 0
            before = tal.mismatch
            while done < tiles_per_combo and not ctx.out_of_time():
                nt = min(batch, tiles_per_combo - done)
                tiles = mc.gen_stress_tiles(rng, fmt, k, nt, hc)
                a, bt = (torch.from_numpy(tiles[key].view(iview)).to(ctx.device).view(tdt) for key in ("a", "bt"))
                c = torch.from_numpy(tiles["c"].view(np.int32)).to(ctx.device).view(torch.float32) if hc else None
                d = to_np_bits(be.run_tiles(fmt, k, hc, 0, a, bt, c)).reshape(nt, 64, 64)
                av = tiles["a"].view(dtype)
                bv = tiles["bt"].view(dtype)
                cv = tiles["c"].view(np.float32) if hc else None
                for t in range(nt):
                    got = ef.matmul(av[t], bv[t].T, model, None if cv is None else cv[t])
                    diff = tal.add(d[t], got)
                    if diff.any():
                        lst = keep.setdefault(name, [])
                        for idx in np.flatnonzero(diff)[:4]:
                            if len(lst) < 400:
                                i, j = divmod(int(idx), 64)
                                lst.append(
                                    (
                                        k,
                                        av[t, i].view(uview),
                                        bv[t, j].view(uview),
                                        np.float32(cv[t, i, j] if hc else np.nan),
                                        d[t, i, j],
                                    )
                                )
                done += nt
            st["per_combo"][f"K{k}_{'c' if hc else 'noc'}"] = {"tiles": done, "mismatch": tal.mismatch - before}
        st |= tal.json()
        st["dots"] = tal.compared
        st["seconds"] = round(time.monotonic() - t0, 1)
        res[name] = st
        ctx.log(f"dot {name}: {tal.compared} dots, {tal.mismatch} mismatches ({st['seconds']} s)")
    res["fp8_maxi32"] = dot_fp8_promoted(ctx, be, rng)
    save = {}
    for name, lst in keep.items():
        for n_, (k, ar, br, cc, dd) in enumerate(lst):
            save[f"{name}_{n_}_K{k}_a"] = ar
            save[f"{name}_{n_}_K{k}_b"] = br
            save[f"{name}_{n_}_c"] = np.array(cc)
            save[f"{name}_{n_}_d"] = np.array(dd)
    if save:
        np.savez_compressed(ctx.out / "dot_mismatches.npz", **save)
    return res


def dot_fp8_promoted(ctx, be, rng) -> dict:
    """FP8 with max_num_imprecise_acc=32: the promoted preset, and the same spelled out (chunks without C,
    each added to C in float32), against the GPU."""
    import ml_dtypes

    from studies.probes import mma_cases as mc
    from studies.probes.formats import FORMATS

    out = {}
    for fname, npdt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        fmt = FORMATS[fname]
        tal_preset, tal_spelled = Tally(), Tally()
        for k in (64, 128, 256):
            for hc in (False, True):
                if ctx.out_of_time():
                    break
                nt = 24
                tiles = mc.gen_stress_tiles(rng, fmt, k, nt, hc)
                a, bt = (
                    torch.from_numpy(tiles[key].view(np.int8)).to(ctx.device).view(getattr(torch, fmt.torch_dtype))
                    for key in ("a", "bt")
                )
                c = torch.from_numpy(tiles["c"].view(np.int32)).to(ctx.device).view(torch.float32) if hc else None
                d = to_np_bits(be.run_tiles(fmt, k, hc, 32, a, bt, c)).reshape(nt, 64, 64)
                av, bv = tiles["a"].view(npdt), tiles["bt"].view(npdt)
                for t in range(nt):
                    cc = tiles["c"].view(np.float32)[t] if hc else None
                    tal_preset.add(d[t], ef.matmul(av[t], bv[t].T, h100.WGMMA_FP8_PROMOTED, cc))
                    acc = cc.copy() if hc else np.zeros((64, 64), np.float32)
                    for s in range(0, k, 32):
                        acc = acc + ef.matmul(av[t][:, s : s + 32], bv[t][:, s : s + 32].T, h100.WGMMA_FP8)
                    tal_spelled.add(d[t], acc)
        out[fname] = {"preset": tal_preset.json(), "c_in_fp32_accumulator": tal_spelled.json()}
    return out


def section_tf32(ctx) -> dict:
    import dataclasses

    rng = np.random.default_rng(ctx.seed + 2)
    cands = {}
    for w in (4, 8, 16):
        for conv in ("rtz", "rna", "rne"):
            cands[f"w{w}_{conv}"] = (dataclasses.replace(h100.WGMMA_TF32, width=w), conv)
    tallies = {k: Tally(keep=4) for k in cands}
    save = {}
    for k in (16, 64, 128):
        for hc in (False, True):
            nt = 12
            mag = 2.0 ** rng.integers(-20, 21, size=(2, nt, 64, k))
            vals = rng.standard_normal((2, nt, 64, k)) * mag
            vals[rng.random((2, nt, 64, k)) < 0.1] = 0.0
            vals[0, :, :, : k // 2] *= np.where(rng.random((nt, 64, 1)) < 0.3, 2.0**30, 1.0)
            a32 = vals[0].astype(np.float32)
            bt32 = vals[1].astype(np.float32)
            c32 = (rng.standard_normal((nt, 64, 64)) * 2.0 ** rng.integers(-10, 11, size=(nt, 64, 64))).astype(
                np.float32
            )
            a = torch.from_numpy(a32).to(ctx.device)
            b = torch.from_numpy(np.ascontiguousarray(bt32.transpose(0, 2, 1))).to(ctx.device)
            c = torch.from_numpy(c32).to(ctx.device)
            d = torch.empty((nt, 64, 64), dtype=torch.float32, device=ctx.device)
            _tf32_kernel[(nt,)](a, b, c, d, K=k, HAS_C=hc, num_warps=4)
            dn = to_np_bits(d).reshape(nt, 64, 64)
            tag = f"K{k}_{'c' if hc else 'noc'}"
            save |= {f"{tag}_a": a32.view(np.uint32), f"{tag}_bt": bt32.view(np.uint32), f"{tag}_d": dn}
            if hc:
                save[f"{tag}_c"] = c32.view(np.uint32)
            for name, (model, conv) in cands.items():
                aq = ef.quantize(a32, ef.TF32, conv).astype(np.float32)
                bq = ef.quantize(bt32, ef.TF32, conv).astype(np.float32)
                for t in range(nt):
                    tallies[name].add(dn[t], ef.matmul(aq[t], bq[t].T, model, c32[t] if hc else None))
    np.savez_compressed(ctx.out / "tf32.npz", **save)
    return {name: t.json() for name, t in tallies.items()} | {"file": "tf32.npz"}


def section_reduction(ctx) -> dict:
    from emufloat import trees
    from studies.probes.inputs import random_rows
    from studies.probes.reduction import TritonReduceBackend, pack_rows, reduce_rows

    be = TritonReduceBackend()
    rng = np.random.default_rng(ctx.seed + 3)
    res = {}
    nrows = ctx.params.get("reduction_rows", 131072)
    block_ns = ctx.params.get("reduction_block_n", [16, 32, 64, 128, 256])
    rows = {bn: random_rows(rng, nrows, bn)[0] for bn in block_ns}
    for bm in (64, 128):
        for bn in block_ns:
            for w in (4, 8):
                for layout in ("dot", "load"):
                    key = f"BM{bm}_BN{bn}_w{w}_{layout}"
                    try:  # recorded tiles, and the others by the layout rules (derived_tl_sum)
                        tree = h100.tl_sum(bm, bn, w, layout)
                    except ValueError as exc:
                        res[key] = {"not_modelled": str(exc)}
                        continue
                    x = rows[bn]
                    s, m = reduce_rows(be, pack_rows(x, bm, bn, ctx.device, 0.0), len(x), bm, bn, w, layout == "dot")
                    ts, tm = Tally(keep=4), Tally(keep=4)
                    ts.add(s, trees.tree_sum(x, tree))
                    tm.add(m, trees.tree_max(x, tree))
                    res[key] = {"sum": ts.json(), "max": tm.json(), "tree": tree.name}
    return res


def section_libdevice(ctx) -> dict:
    """libdevice functions: seeded random and edge inputs kept for the CPU tests (`libdevice.npz`), then
    all 2**32 inputs against emufloat.hw.libdevice with a checksum per chunk."""
    out, res = unary_cases(ctx, LIBDEVICE, np.random.default_rng(ctx.seed))
    res = {f"cases_{name}": tally for name, tally in res.items()}
    np.savez_compressed(ctx.out / "libdevice.npz", seed=np.array(ctx.seed), **out)
    res["file"] = "libdevice.npz"
    return res | section_sweep(ctx, tuple(LIBDEVICE))


SECTIONS = {
    "rcp": section_rcp,
    "cases": section_cases,
    "sweep": section_sweep,
    "div": section_div,
    "dot": section_dot,
    "tf32": section_tf32,
    "reduction": section_reduction,
    "libdevice": section_libdevice,
}


class Ctx:
    def __init__(self, out: Path, seed: int, deadline: float, params: dict) -> None:
        self.out, self.seed, self.deadline, self.params = out, seed, deadline, params
        self.device = "cuda"
        self.logf = open(out / "verify.log", "a", buffering=1)  # noqa: SIM115

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.logf.write(line + "\n")


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="python -m studies.device.verify_models", description="verify emufloat's hardware models on the GPU"
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for verify.json and the recorded cases")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--seconds", type=float, default=540.0, help="overall budget")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--params", default="{}", help="JSON overrides, e.g. '{\"dots_per_type\": 100000}'")
    return ap


def run(args: argparse.Namespace) -> int:
    names = sections(args.sections, tuple(SECTIONS))
    positive(args.seconds, "--seconds")
    params = json_params(args.params)
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.verify_models")
    t_start = time.monotonic()
    ctx = Ctx(out, args.seed, t_start + args.seconds, params)
    from studies.probes import env

    results: dict = {"argv": vars(args) | {"out": str(out)}, "env": env.run(None), "sections": {}}
    for name in names:
        if ctx.out_of_time():
            results["sections"][name] = {"status": "skipped: out of time"}
            continue
        ctx.log(f"section {name} ...")
        t0 = time.monotonic()
        try:
            r = SECTIONS[name](ctx)
            results["sections"][name] = {"status": "ok", "seconds": round(time.monotonic() - t0, 1), "result": r}
        except Exception as e:  # noqa: BLE001
            results["sections"][name] = {"status": f"error: {e!r}"[:2000], "traceback": traceback.format_exc()}
        ctx.log(f"section {name}: {results['sections'][name]['status']} ({time.monotonic() - t0:.1f} s)")
        results["total_seconds"] = round(time.monotonic() - t_start, 1)
        (out / "verify.json").write_text(json.dumps(jsonable(results), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("python -m studies.device.verify_models", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
