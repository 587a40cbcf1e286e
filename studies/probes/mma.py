"""Probe 3: tl.dot on 64x64xK tiles (num_warps=4: one warpgroup, wgmma m64nNk16/k32) for bf16, fp16, fp8.

Single-element probes (studies.probes.mma_cases) determine the block of products added in one fused step, the
alignment fraction bits, the final rounding, zero products, tiny values, C pass-through and specials, with and
without accumulator, and for fp8 also with `max_num_imprecise_acc=32` (promotion to fp32 every 32 k).
Random stress tiles (K in 16..256, with and without C) are stored as bits with the GPU outputs and compared
with the tensor-core model `emufloat.FusedBlock` (`emufloat.matmul`) for the fitted parameters and the
published ones (the emufloat presets `h100.WGMMA_BF16`, `h100.WGMMA_FP16`, `h100.WGMMA_FP8`).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import triton
import triton.language as tl

from . import mma_cases as mc
from . import torchutil as tu
from .common import has_mnemonic
from .formats import FORMATS, Fmt

NUM_WARPS = 4
PROBE_K = 64


@triton.jit
def _dot_tile_kernel(
    a_ptr, b_ptr, c_ptr, d_ptr, K: tl.constexpr, HAS_C: tl.constexpr, MAXI: tl.constexpr, BT: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    rm = tl.arange(0, 64)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + t * 64 * K + rm[:, None] * K + rk[None, :])
    if BT:
        # B given as B^T (64 x K, K contiguous): K-major operand
        bt = tl.load(b_ptr + t * 64 * K + rm[:, None] * K + rk[None, :])
        b = tl.trans(bt)
    else:
        b = tl.load(b_ptr + t * K * 64 + rk[:, None] * 64 + rm[None, :])
    if HAS_C:
        c = tl.load(c_ptr + t * 4096 + rm[:, None] * 64 + rm[None, :])
        if MAXI > 0:
            d = tl.dot(a, b, c, max_num_imprecise_acc=MAXI)
        else:
            d = tl.dot(a, b, c)
    else:
        if MAXI > 0:
            d = tl.dot(a, b, max_num_imprecise_acc=MAXI)
        else:
            d = tl.dot(a, b)
    tl.store(d_ptr + t * 4096 + rm[:, None] * 64 + rm[None, :], d)


class TritonDotBackend:
    """Runs 64x64xK tiles through tl.dot; picks the B layout that gives wgmma and keeps the evidence."""

    def __init__(self) -> None:
        self.evidence: dict = {}
        self.layout: dict = {}
        self.compile_seconds = 0.0

    def _launch(self, bt_mode, a, bt, c, d, K, has_c, maxi):
        T = a.shape[0]
        b_arg = bt if bt_mode else bt.transpose(1, 2).contiguous()
        return _dot_tile_kernel[(T,)](
            a, b_arg, c if has_c else d, d, K=K, HAS_C=has_c, MAXI=maxi, BT=bt_mode, num_warps=NUM_WARPS
        )

    def run_tiles(self, fmt: Fmt, K: int, has_c: bool, maxi: int, a, bt, c) -> torch.Tensor:
        """a, bt: [T, 64, K] tensors of the input dtype; c: [T, 64, 64] float32 or None. Returns d [T, 64, 64]."""
        key = f"{fmt.name}_K{K}_{'c' if has_c else 'noc'}_maxi{maxi}"
        T = a.shape[0]
        d = torch.empty((T, 64, 64), dtype=torch.float32, device=a.device)
        if key not in self.layout:
            t0 = time.monotonic()
            tried = {}
            chosen = None
            for mode in (1, 0):
                try:
                    k = self._launch(mode, a, bt, c, d, K, has_c, maxi)
                    ev = tu.kernel_evidence(k)
                    tried[f"BT={mode}"] = ev
                    if has_mnemonic(ev.get("ptx", {}), "wgmma") or ev.get("ptx", {}).get("unavailable"):
                        chosen = mode
                        break
                    if chosen is None:
                        chosen = mode
                except Exception as e:  # noqa: BLE001
                    tried[f"BT={mode}"] = {"error": repr(e)[:500]}
            self.compile_seconds += time.monotonic() - t0
            if chosen is None:
                raise RuntimeError(f"tl.dot kernel failed for {key}: {tried}")
            self.layout[key] = chosen
            self.evidence[key] = {"chosen": f"BT={chosen}", "tried": tried}
        self._launch(self.layout[key], a, bt, c, d, K, has_c, maxi)
        return d


def make_dot_fn(be, fmt: Fmt, K: int, maxi: int, device, batch: int = 8192):
    """dot_fn for mma_cases: vectors -> broadcast tiles -> tl.dot -> (d[:,0,0] bits, all-4096-equal flags)."""

    def fn(a_bits: np.ndarray, b_bits: np.ndarray, c_bits):
        outs, unis = [], []
        for s in range(0, a_bits.shape[0], batch):
            av = tu.np_bits_to_torch(a_bits[s : s + batch], fmt.torch_dtype, device)
            bv = tu.np_bits_to_torch(b_bits[s : s + batch], fmt.torch_dtype, device)
            T = av.shape[0]
            a = av[:, None, :].expand(T, 64, K).contiguous()
            bt = bv[:, None, :].expand(T, 64, K).contiguous()
            c = None
            if c_bits is not None:
                cv = tu.bits_to_f32(torch.from_numpy(c_bits[s : s + batch].astype(np.int64)).to(device))
                c = cv[:, None, None].expand(T, 64, 64).contiguous()
            d = be.run_tiles(fmt, K, c is not None, maxi, a, bt, c)
            di = d.view(T, -1).view(torch.int32)
            d00 = di[:, :1]
            same = (di == d00) | (torch.isnan(d.view(T, -1)) & torch.isnan(d.view(T, -1)[:, :1]))
            outs.append(di[:, 0].cpu().numpy().view(np.uint32))
            unis.append(same.all(dim=1).cpu().numpy())
        return np.concatenate(outs), np.concatenate(unis)

    return fn


STRESS_K = {"bf16": (16, 32, 64, 128, 256), "fp16": (16, 32, 64, 128, 256), "e4m3": (32, 64, 128, 256),
            "e5m2": (32, 64, 128, 256)}  # fmt: skip
PUBLISHED = mc.PUBLISHED  # fmt name -> emufloat preset (h100.WGMMA_BF16, h100.WGMMA_FP16, h100.WGMMA_FP8)


def run(ctx) -> dict:
    dev = ctx.device
    be = ctx.backend or TritonDotBackend()
    params = getattr(ctx, "params", {}) or {}
    fmts = params.get("mma_formats", ("bf16", "fp16", "e4m3", "e5m2"))
    result: dict = {"num_warps": NUM_WARPS, "probe_K": PROBE_K, "formats": {}}
    case_arrays: dict = {}
    # ---- single-element probes
    for name in fmts:
        fmt = FORMATS[name]
        variants = [("default", 0)] + ([("maxi32", 32)] if fmt.kstep == 32 else [])
        for vname, maxi in variants:
            if ctx.time_left() < 30:
                result["formats"].setdefault(name, {})[vname] = {"skipped": "time budget"}
                continue
            t0 = time.monotonic()
            ctx.log(f"mma: {name}/{vname}: single-element probes")
            try:
                fn = make_dot_fn(be, fmt, PROBE_K, maxi, dev)
                concl, arrays = mc.probe_format(fmt, PROBE_K, fn, log=ctx.log)
                concl["seconds"] = time.monotonic() - t0
                for k, v in arrays.items():
                    case_arrays[f"{name}_{vname}_{k}"] = v
            except Exception as e:  # noqa: BLE001
                import traceback

                concl = {"error": repr(e)[:500], "traceback": traceback.format_exc()[-4000:]}
                ctx.log(f"mma: {name}/{vname}: failed: {e!r}")
            result["formats"].setdefault(name, {})[vname] = concl
            ctx.checkpoint({"partial": True, **result})
    if case_arrays:
        np.savez_compressed(ctx.out / "mma_cases.npz", **case_arrays)
        result["npz_cases"] = "mma_cases.npz"
    # ---- stress tiles
    stress_arrays: dict = {}
    stress: dict = {}
    all_tiles: dict = {}
    n_target = params.get("mma_stress_per_type", 2000 if ctx.quick else 200_000)
    for name in fmts:
        fmt = FORMATS[name]
        Ks = params.get("mma_stress_K", STRESS_K[name])
        configs = [(K, hc) for K in Ks for hc in (False, True)]
        n_tiles = max(1, -(-n_target // (4096 * len(configs))))
        seed = ctx.seed + 1000 * (1 + list(FORMATS).index(name))
        rng = np.random.default_rng(seed)
        st = {"seed": seed, "rng": "numpy.random.default_rng(seed), configs in order", "tiles_per_config": n_tiles,
              "configs": [], "dot_products": 0}  # fmt: skip
        tiles_by_cfg = all_tiles.setdefault(name, {})
        for K, hc in configs:
            if ctx.time_left() < 25:
                st["stopped_early"] = "time budget"
                break
            tiles = mc.gen_stress_tiles(rng, fmt, K, n_tiles, hc)
            a = tu.np_bits_to_torch(tiles["a"], fmt.torch_dtype, dev)
            bt = tu.np_bits_to_torch(tiles["bt"], fmt.torch_dtype, dev)
            c = None
            if hc:
                c = tu.bits_to_f32(torch.from_numpy(tiles["c"].astype(np.int64)).to(dev))
            try:
                d = be.run_tiles(fmt, K, hc, 0, a, bt, c)
            except Exception as e:  # noqa: BLE001
                st["configs"].append({"K": K, "has_c": hc, "error": repr(e)[:300]})
                continue
            dbits = d.view(torch.int32).cpu().numpy().view(np.uint32)
            tag = f"{name}_K{K}_{'c' if hc else 'noc'}"
            for k, v in tiles.items():
                stress_arrays[f"{tag}_{k}"] = v
            stress_arrays[f"{tag}_d"] = dbits
            tiles_by_cfg[(K, hc)] = (tiles, dbits)
            st["configs"].append({"K": K, "has_c": hc, "tiles": n_tiles, "tag": tag})
            st["dot_products"] += n_tiles * 4096
        stress[name] = st
    if stress_arrays:
        np.savez_compressed(ctx.out / "mma.npz", **stress_arrays)
        result["npz_stress"] = "mma.npz"
    result["stress"] = stress
    ctx.checkpoint({"partial": True, **result})
    # ---- model comparison on the stress data (CPU, emufloat)
    for name in fmts:
        fmt = FORMATS[name]
        sets: dict = {"published": PUBLISHED[name]}
        cmp: dict = {}
        try:
            fitted = mc.fitted_model(result["formats"].get(name, {}).get("default", {}))
        except ValueError as e:  # fitted parameters FusedBlock cannot take
            fitted = None
            cmp["fitted"] = {"error": repr(e)[:300]}
        if fitted is not None:
            sets = {"fitted": fitted, **sets}
        for sname, model in sets.items():
            if ctx.time_left() < 20:
                cmp[sname] = {"skipped": "time budget"}
                continue
            tot = {"params": mc.model_params(model), "n": 0, "match": 0, "by_config": {}}
            for (K, hc), (tiles, dbits) in all_tiles.get(name, {}).items():
                r = mc.stress_model_matches(fmt, tiles, dbits, model)
                tot["n"] += r["n"]
                tot["match"] += r["match"]
                tot["by_config"][f"K{K}_{'c' if hc else 'noc'}"] = r
            cmp[sname] = tot
        stress.get(name, {})["model_comparison"] = cmp
    result["evidence"] = getattr(be, "evidence", {})
    result["compile_seconds"] = getattr(be, "compile_seconds", None)
    summ = {}
    for name in fmts:
        d = result["formats"].get(name, {}).get("default", {})
        m = d.get("model", {})
        mc_ = stress.get(name, {}).get("model_comparison", {})
        best = max(
            ((v["match"] / v["n"], k) for k, v in mc_.items() if isinstance(v, dict) and v.get("n")), default=None
        )
        instr = ",".join(
            sorted(
                {
                    k
                    for key, e in result["evidence"].items()
                    if key.startswith(name + "_")
                    for t in e.get("tried", {}).values()
                    for k in t.get("ptx", {}).get("mnemonics", {})
                    if k.startswith(("wgmma.mma", "mma."))
                }
            )
        )
        summ[name] = (
            f"block={m.get('block')} frac={m.get('frac_bits')} out={m.get('out_frac_bits')} "
            f"rnd={m.get('rounding')} zero_in_max={m.get('zero_products_affect_alignment')}"
            + (f" stress {best[1]} {best[0]:.4%}" if best else "")
            + (f" [{instr}]" if instr else "")
        )
    result["summary"] = summ
    return result
