"""Probe 5: `lg2.approx.f32` (MUFU.LG2), what CUDA's fast-math `__logf` and FlashAttention-2's LSE use.

    PYTHONPATH=. python -m studies.probes.lg2 --out $OUT

On the GPU: the table T[k] = lg2.approx(1 + k 2**-23) over the 2**23 significands, the outputs on
[1/2, 1) (where the hardware's finer value shows through) and on the subnormals without `.ftz`; then
every positive normal input, with and without `.ftz`, against the model (`model`: truncation
toward zero of e + T[k]; below 1/2, one ulp nearer zero where the outputs on [1/2, 1) show the
hardware's value above T[k]), counted per exponent; the special inputs; and the PTX nvcc emits for
`__logf` under `-use_fast_math`.  Writes `lg2.json`, `lg2.npz` (the three recorded arrays,
delta-encoded, with the SHA-256 of their bits) and `lg2_sample.npz` (random inputs through `.ftz`,
plain and `__logf`, for the CPU tests).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from gpu.commands import probe_main

NGRID = 1 << 23
SAMPLE_SEED = 20261127


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def lg2_kernel(x_ptr, y_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=1.0)
        if MODE == 2:  # __logf under -use_fast_math (the PTX nvcc emits, below)
            y = tl.inline_asm_elementwise(
                "{ .reg .f32 t; lg2.approx.ftz.f32 t, $1; mul.ftz.f32 $0, t, 0f3F317218; }",
                "=f,f",
                [x],
                dtype=tl.float32,
                is_pure=True,
                pack=1,
            )
        elif MODE == 1:  # .ftz
            y = tl.inline_asm_elementwise(
                "lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
        tl.store(y_ptr + offs, y, mask=m)

    return lg2_kernel


def lg2(kernel, x, mode: int):
    """lg2.approx of a float32 tensor: `mode` 0 plain, 1 (or True) `.ftz`, 2 `__logf` under fast math."""
    import torch

    y = torch.empty_like(x)
    kernel[((x.numel() + 1023) // 1024,)](x, y, x.numel(), MODE=int(mode), BLOCK=1024)
    return y


def fast_logf_ptx() -> str:
    """The PTX nvcc writes for `__logf(x)`, `a * b + __logf(x)` (FA2's LSE) and `logf(x) + a` (its
    combine) under `-use_fast_math`."""
    src = (
        'extern "C" __global__ void f(const float* x, float* y, float a, float b) {\n'
        "  int i = threadIdx.x; y[i] = __logf(x[i]); y[i + 32] = a * b + __logf(x[i]);\n"
        "  y[i + 64] = logf(x[i]) + a; }\n"
    )
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "f.cu").write_text(src)
        res = subprocess.run(
            ["nvcc", "-use_fast_math", "-arch=sm_90", "-ptx", "f.cu", "-o", "f.ptx"],
            cwd=d,
            capture_output=True,
            text=True,
        )
        if res.returncode:
            return f"nvcc failed: {res.stderr[-2000:]}"
        text = (Path(d) / "f.ptx").read_text()
    return "\n".join(line for line in text.splitlines() if any(op in line for op in ("lg2", "mul", "fma", "add")))


def rz32(s):
    """float64 tensor -> float32 rounded toward zero (s exact in float64)."""
    import torch

    r = s.float()
    over = r.double().abs() > s.abs()
    return torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)


def model(e: int, table, m1, flag):
    """The model of lg2.approx(2**e (1 + k 2**-23)) for every k, as float32 (on the table's device).

    e >= 0: RZ(e + T[k]).  e = -1: the recorded outputs `m1`.  e <= -2: -RZ(|e| - T[k]), one ulp nearer
    zero where |e| - T[k] is on the float32 grid and `flag[k]` (the hardware's value lies above T[k]).
    `|e| +- T` is exact in float64.
    """
    import torch

    if e >= 0:
        return rz32(e + table)
    if e == -1:
        return m1
    mag = -e - table
    r = rz32(mag)
    step = (r.double() == mag) & flag
    return -torch.where(step, torch.nextafter(r, torch.zeros_like(r)), r)


def above_t_flag(table, m1):
    """Where the outputs at e = -1 lie nearer zero than -RZ(1 - T[k]) although 1 - T[k] is on the grid."""
    plain = -rz32(1.0 - table)
    return (m1.view(plain.dtype) != plain) & (plain.double() == table - 1.0)


def delta_encode(bits: np.ndarray) -> np.ndarray:
    """First differences of uint32 bits, wrapping (`np.cumsum(d, dtype=np.uint32)` rebuilds them): smooth
    tables such as lg2's compress about fifty times better so."""
    return np.diff(bits, prepend=np.uint32(0)).astype(np.uint32)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """`np.savez` at zlib's highest level (np.load reads it)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(a), allow_pickle=False)
            zf.writestr(f"{name}.npy", buf.getvalue())


def run(out: Path) -> int:
    import torch

    t0 = time.monotonic()
    kern = _kernel()
    dev = "cuda"
    res: dict = {"device": torch.cuda.get_device_name()}
    k = torch.arange(NGRID, device=dev, dtype=torch.int64)

    def at(eb: int, ftz: bool):
        return lg2(kern, ((eb << 23) + k).to(torch.int32).view(torch.float32), ftz)

    table = at(127, True)
    m1 = at(126, True)
    sub = lg2(kern, k.to(torch.int32).view(torch.float32), False)
    res["ftz_equals_noftz_at_e_0_and_-1"] = bool(
        torch.equal(table.view(torch.int32), at(127, False).view(torch.int32))
        and torch.equal(m1.view(torch.int32), at(126, False).view(torch.int32))
    )
    t64 = table.double()
    flag = above_t_flag(t64, m1)
    res["flag_count"] = int(flag.sum())
    arrays = {"table_bits": table, "m1_bits": m1, "subnormal_noftz_bits": sub}
    host = {}
    for name, a in arrays.items():
        bits = a.view(torch.int32).cpu().numpy().view(np.uint32)
        host[name.replace("_bits", "_diff")] = delta_encode(bits)
        host[name.replace("_bits", "_sha256")] = np.array(hashlib.sha256(bits.tobytes()).hexdigest())
    write_npz(out / "lg2.npz", host)
    # every positive normal input against the model, per exponent, ftz and not
    mism = {}
    first = []
    for ftz in (True, False):
        by_e = {}
        for eb in range(1, 255):
            got = at(eb, ftz).view(torch.int32)
            want = model(eb - 127, t64, m1, flag).view(torch.int32)
            bad = got != want
            nb = int(bad.sum())
            if nb:
                by_e[eb - 127] = nb
                for i in torch.nonzero(bad)[: max(0, 12 - len(first)), 0].tolist():
                    first.append(
                        [
                            ftz,
                            f"{(eb << 23) + i:#010x}",
                            f"{int(got[i]) & 0xFFFFFFFF:#010x}",
                            f"{int(want[i]) & 0xFFFFFFFF:#010x}",
                        ]
                    )
        mism["ftz" if ftz else "noftz"] = {"inputs": 254 * NGRID, "mismatches": sum(by_e.values()), "by_e": by_e}
    res["model_normal_inputs"] = mism
    res["first_mismatches"] = first
    # a sample for the CPU tests: random bit patterns and values near 1, through .ftz, plain and __logf
    rng = np.random.default_rng(SAMPLE_SEED)
    xs = np.concatenate(
        [
            rng.integers(0, 2**32, 2**17, dtype=np.uint64).astype(np.uint32),
            (rng.uniform(0.25, 4.0, 2**15).astype(np.float32)).view(np.uint32),
            np.float32(1.0).view(np.uint32) + rng.integers(-(2**12), 2**12, 2**13).astype(np.uint32),
        ]
    )
    xt = torch.from_numpy(xs.view(np.int32)).to(dev).view(torch.float32)
    sample = {"x": xs}
    for mode, key in ((1, "ftz"), (0, "noftz"), (2, "fast_logf")):
        sample[key] = lg2(kern, xt, mode).view(torch.int32).cpu().numpy().view(np.uint32)
    np.savez_compressed(out / "lg2_sample.npz", seed=np.array(SAMPLE_SEED), **sample)
    special = np.array(
        [
            0x00000000,
            0x80000000,
            0x00000001,
            0x007FFFFF,
            0x00400000,
            0x80000001,
            0xBF800000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x7F800001,
            0x3F800000,
            0x3F800001,
            0x3F7FFFFF,
        ],
        np.uint32,
    )
    xs = torch.from_numpy(special.view(np.int32)).to(dev).view(torch.float32)
    res["special"] = {
        f"{int(b):#010x}": {"ftz": f"{int(a) & 0xFFFFFFFF:#010x}", "noftz": f"{int(c) & 0xFFFFFFFF:#010x}"}
        for b, a, c in zip(
            special,
            lg2(kern, xs, True).view(torch.int32).cpu().tolist(),
            lg2(kern, xs, False).view(torch.int32).cpu().tolist(),
            strict=True,
        )
    }
    res["fast_logf_ptx"] = fast_logf_ptx()
    res["seconds"] = round(time.monotonic() - t0, 1)
    (out / "lg2.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "special"}, indent=1)[:6000])
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(
        "studies.probes.lg2", "probe lg2.approx.f32 on the GPU", "lg2.json, lg2.npz and lg2_sample.npz", run, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
