"""Probe 5: ``lg2.approx.f32`` (MUFU.LG2), what CUDA's fast-math ``__logf`` and FlashAttention-2's LSE use.

    PYTHONPATH=. python -m gpu.probes.lg2 --out $OUT

On the GPU: the table T[k] = lg2.approx(1 + k 2**-23) over the 2**23 significands; the flag of the
significands whose hardware value lies below T[k] (read off the inputs in [1/2, 1)); then every positive
normal input against the model (:func:`model`: truncation toward zero of e + T[k], one ulp nearer zero
for e < 0 where the flag says so), counted per exponent, with and without ``.ftz``; subnormal inputs
without ``.ftz`` against the model of x 2**24; the special inputs; and the PTX nvcc emits for ``__logf``
under ``-use_fast_math``.  Writes ``lg2.json`` and ``lg2.npz`` (the table's bits and the packed flags,
with their SHA-256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir

from ..scripts.device_cli import require_gpu

NGRID = 1 << 23
CHUNK = 1 << 26


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def lg2_kernel(x_ptr, y_ptr, n, FTZ: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=1.0)
        if FTZ:
            y = tl.inline_asm_elementwise(
                "lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
        tl.store(y_ptr + offs, y, mask=m)

    return lg2_kernel


def lg2(kernel, x, ftz: bool):
    import torch

    y = torch.empty_like(x)
    kernel[((x.numel() + 1023) // 1024,)](x, y, x.numel(), FTZ=ftz, BLOCK=1024)
    return y


def fast_logf_ptx() -> str:
    """The PTX nvcc writes for ``__logf(x)`` and for ``a * b + __logf(x)`` under ``-use_fast_math``."""
    src = (
        'extern "C" __global__ void f(const float* x, float* y, float a, float b) {\n'
        "  int i = threadIdx.x; y[i] = __logf(x[i]); y[i + 32] = a * b + __logf(x[i]); }\n"
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


def model(e: int, table, flag):
    """The model of lg2.approx(2**e (1 + k 2**-23)) for every k, as float32 (on the table's device).

    e >= 0: RZ(e + T[k]).  e < 0: -RZ(|e| - T[k]), one ulp nearer zero where |e| - T[k] is on the float32
    grid and ``flag[k]`` (the hardware's fixed-point value lies below T[k]).  ``|e| +- T`` is exact in float64.
    """
    import torch

    if e >= 0:
        return rz32(e + table)
    mag = -e - table
    r = rz32(mag)
    step = (r.double() == mag) & flag & (table != 0)
    r = torch.where(step, torch.nextafter(r, torch.zeros_like(r)), r)
    return -r


def run(args: argparse.Namespace) -> int:
    out = writable_dir(args.out, "--out")
    require_gpu("python -m gpu.probes.lg2")
    import torch

    t0 = time.monotonic()
    kern = _kernel()
    dev = "cuda"
    res: dict = {"device": torch.cuda.get_device_name()}
    k = torch.arange(NGRID, device=dev, dtype=torch.int64)
    sig = (k + 0x3F800000).to(torch.int32).view(torch.float32)
    table = {ftz: lg2(kern, sig, ftz) for ftz in (True, False)}
    res["table_ftz_equals_noftz"] = bool(torch.equal(table[True].view(torch.int32), table[False].view(torch.int32)))
    t32 = table[True]
    t64 = t32.double()
    # the flag: where lg2.approx(2**-1 (1 + k 2**-23)) lies one ulp nearer zero than -RZ(1 - T[k])
    y = lg2(kern, ((126 << 23) + k).to(torch.int32).view(torch.float32), True)
    plain = model(-1, t64, torch.zeros_like(k, dtype=torch.bool))
    on_grid = rz32(1.0 - t64).double() == 1.0 - t64
    flag = (y.view(torch.int32) != plain.view(torch.int32)) & on_grid
    res["flag_count"] = int(flag.sum())
    res["e_minus_1_off_grid_mismatch"] = int(((y.view(torch.int32) != plain.view(torch.int32)) & ~on_grid).sum())
    t_bits = t32.view(torch.int32).cpu().numpy().view(np.uint32)
    f_bits = np.packbits(flag.cpu().numpy())
    np.savez_compressed(
        out / "lg2.npz",
        table_bits=t_bits,
        flag_packed=f_bits,
        table_sha256=np.array(hashlib.sha256(t_bits.tobytes()).hexdigest()),
        flag_sha256=np.array(hashlib.sha256(f_bits.tobytes()).hexdigest()),
    )
    # every positive normal input against the model, per exponent, ftz and not
    mism = {}
    first = []
    for ftz in (True, False):
        by_e = {}
        for eb in range(1, 255):
            x = ((eb << 23) + k).to(torch.int32).view(torch.float32)
            got = lg2(kern, x, ftz).view(torch.int32)
            want = model(eb - 127, t64, flag).view(torch.int32)
            bad = got != want
            nb = int(bad.sum())
            if nb:
                by_e[eb - 127] = nb
                if len(first) < 12:
                    for i in torch.nonzero(bad)[:3, 0].tolist():
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
    # subnormal inputs without .ftz: against the normal model of x * 2**24, minus 24
    got = lg2(kern, k[1:].to(torch.int32).view(torch.float32), False)
    xs = k[1:].double() * 2.0**-149
    scaled = (xs * 2.0**24).float()
    sb = scaled.view(torch.int32).long()
    e_s = (sb >> 23) - 127 - 24
    pred = torch.empty_like(got)
    for e in torch.unique(e_s).tolist():
        sel = e_s == e
        pred[sel] = model(e, t64[sb[sel] & 0x7FFFFF], flag[sb[sel] & 0x7FFFFF])
    bad = got.view(torch.int32) != pred.view(torch.int32)
    res["subnormal_noftz_vs_scaled_model"] = {
        "inputs": NGRID - 1,
        "mismatches": int(bad.sum()),
        "first": [
            [
                f"{i + 1:#010x}",
                f"{int(got.view(torch.int32)[i]) & 0xFFFFFFFF:#010x}",
                f"{int(pred.view(torch.int32)[i]) & 0xFFFFFFFF:#010x}",
            ]
            for i in torch.nonzero(bad)[:8, 0].tolist()
        ],
    }
    np.savez_compressed(out / "lg2_subnormal_noftz.npz", bits=got.view(torch.int32).cpu().numpy().view(np.uint32))
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
    ap = ArgumentParser(prog="python -m gpu.probes.lg2", description="probe lg2.approx.f32 on the GPU")
    ap.add_argument("--out", type=Path, required=True, help="folder for lg2.json and lg2.npz")
    args = ap.parse_args(argv)
    return run_command("python -m gpu.probes.lg2", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
