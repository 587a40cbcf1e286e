"""torch helpers shared by the probes (bit views, exact powers of two, histograms, compile evidence)."""

from __future__ import annotations

import numpy as np
import torch

from .common import DEFAULT_PTX_PATTERNS, DEFAULT_SASS_PATTERNS, Hist, asm_evidence

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "float8_e5m2": getattr(torch, "float8_e5m2", None),
}
MASK32 = 0xFFFFFFFF


def bit_range(start: int, size: int, device) -> torch.Tensor:
    """int32 tensor of the 32-bit patterns start, start+1, ..., start+size-1 (taken modulo 2**32)."""
    v = torch.arange(start, start + size, dtype=torch.int64, device=device)
    v = v & MASK32
    v = torch.where(v >= 2**31, v - 2**32, v)
    return v.to(torch.int32)


def u32(x: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit pattern of a float32/int32 tensor, as int64."""
    if x.dtype == torch.float32:
        x = x.view(torch.int32)
    return x.to(torch.int64) & MASK32


def bits_to_f32(b: torch.Tensor) -> torch.Tensor:
    """float32 tensor from int64/int32 tensor of unsigned 32-bit patterns."""
    b = b.to(torch.int64) & MASK32
    b = torch.where(b >= 2**31, b - 2**32, b)
    return b.to(torch.int32).view(torch.float32)


def exact_pow2(n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float64 tensors whose product is exactly 2**n for integer n in [-2000, 2000] (built from bits)."""
    n = n.to(torch.int64).clamp(-2000, 2000)
    n1 = n.clamp(-1000, 1000)
    n2 = (n - n1).clamp(-1000, 1000)

    def p2(k):
        return ((k + 1023) << 52).view(torch.float64)

    return p2(n1), p2(n2)


def ldexp_exact(v: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """v * 2**n in float64 (exact unless the result leaves the float64 range; v normal, |n| <= 2000)."""
    a, b = exact_pow2(n)
    return v.to(torch.float64) * a * b


def f64_to_f32_ftz(v: torch.Tensor, mode: str) -> torch.Tensor:
    """Round float64 to float32 (RN); then flush: 'none', 'after' (subnormal results -> 0), 'exact' (values
    whose exact magnitude is below 2**-126 -> 0)."""
    r = v.to(torch.float32)
    if mode == "after":
        r = torch.where(r.abs() < 2.0**-126, torch.zeros_like(r), r)
    elif mode == "exact":
        r = torch.where(v.abs() < 2.0**-126, torch.zeros_like(r), r)
    return r


def near_midpoint(r64: torch.Tensor, r32: torch.Tensor, rel: float = 2.0**-40) -> torch.Tensor:
    """True where the float64 value r64 lies within rel*|r64| of a midpoint between two float32 values (so its
    float32 rounding r32 could be wrong if r64 is off by that much)."""
    r32d = r32.to(torch.float64)
    inf = torch.full_like(r32, float("inf"))
    toward = torch.where(r64 > r32d, inf, -inf)
    nb = torch.nextafter(r32, toward)
    mid = (r32d + nb.to(torch.float64)) * 0.5
    ok = torch.isfinite(r32) & torch.isfinite(nb) & (r64 != r32d)
    return ok & ((r64 - mid).abs() <= rel * r64.abs())


def hist_add(h: Hist, diff: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Add the int64 differences (where mask) to the exact histogram h."""
    d = diff if mask is None else diff[mask]
    if d.numel() == 0:
        return
    c = torch.bincount((d.clamp(-h.clip, h.clip) + h.clip), minlength=2 * h.clip + 1)
    h.add_bincount(c.cpu().numpy(), int(d.min()), int(d.max()))


def first_true(mask: torch.Tensor, k: int, block: int = 1 << 22) -> torch.Tensor:
    """Indices (int64, on the mask's device) of the first k True entries of a 1-D mask."""
    found = []
    n = 0
    for s in range(0, mask.numel(), block):
        part = mask[s : s + block]
        if not bool(part.any()):
            continue
        idx = torch.nonzero(part).flatten()[: k - n] + s
        found.append(idx)
        n += idx.numel()
        if n >= k:
            break
    if not found:
        return torch.zeros(0, dtype=torch.int64, device=mask.device)
    return torch.cat(found)


def kernel_evidence(compiled, ptx_patterns=DEFAULT_PTX_PATTERNS, sass_patterns=DEFAULT_SASS_PATTERNS) -> dict:
    """Instruction counts and example lines from a Triton CompiledKernel's PTX (and SASS when the disassembler
    works); {"unavailable": ...} for fakes or the interpreter."""
    if compiled is None or not hasattr(compiled, "asm"):
        return {"unavailable": "no compiled kernel (fake backend or interpreter)"}
    ev: dict = {}
    try:
        ptx = compiled.asm.get("ptx") if hasattr(compiled.asm, "get") else compiled.asm["ptx"]
        ev["ptx"] = asm_evidence(ptx, ptx_patterns)
        ev["ptx_version_line"] = next(
            (ln.strip() for ln in (ptx or "").splitlines() if ln.startswith(".version")), None
        )
        ev["ptx_target_line"] = next((ln.strip() for ln in (ptx or "").splitlines() if ln.startswith(".target")), None)
    except Exception as e:  # noqa: BLE001
        ev["ptx"] = {"error": repr(e)}
    try:
        sass = compiled.asm["sass"]
        ev["sass"] = asm_evidence(sass, sass_patterns)
    except Exception as e:  # noqa: BLE001
        ev["sass"] = {"error": repr(e)[:300]}
    try:
        md = compiled.metadata
        ev["num_warps"] = getattr(md, "num_warps", None)
        ev["name"] = getattr(md, "name", None)
        ev["n_regs"] = getattr(compiled, "n_regs", None)
    except Exception:  # noqa: BLE001
        pass
    return ev


def ptx_text(compiled) -> str | None:
    try:
        return compiled.asm["ptx"]
    except Exception:  # noqa: BLE001
        return None


def sass_text(compiled) -> str | None:
    try:
        return compiled.asm["sass"]
    except Exception:  # noqa: BLE001
        return None


def to_numpy_u32(x: torch.Tensor) -> np.ndarray:
    """uint32 numpy array of the bits of a float32 tensor."""
    return x.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)


def np_bits_to_torch(bits: np.ndarray, torch_dtype: str, device) -> torch.Tensor:
    """Bit patterns (uint8/uint16 numpy) to a torch tensor of the named float dtype."""
    dt = TORCH_DTYPES[torch_dtype]
    if dt is None:
        raise RuntimeError(f"this torch has no {torch_dtype}")
    if bits.dtype == np.uint16:
        t = torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).to(device)
    elif bits.dtype == np.uint8:
        t = torch.from_numpy(np.ascontiguousarray(bits)).to(device)
    else:
        raise TypeError(bits.dtype)
    return t.view(dt)
