"""Probe 5: ``lg2.approx.f32`` (MUFU.LG2), what CUDA's fast-math ``__logf`` and FlashAttention-2's LSE use.

    PYTHONPATH=. python -m gpu.probes.lg2 --out $OUT

On the GPU: the table T[k] = lg2.approx(1 + k 2**-23) over the 2**23 significands, then every positive
normal input x = 2**e (1 + k 2**-23) against the hypothesis lg2.approx(x) = fl(e + T[k]) (one fp32 addition,
round to nearest), counted per exponent; the special inputs (zeros, subnormals, negatives, inf, NaN) with
and without ``.ftz``; and the PTX nvcc emits for ``__logf`` under ``-use_fast_math``.  Writes ``lg2.json``
and ``lg2.npz`` (T as int32 corrections, in float32 ulps, to the correctly rounded log2, with the table's
SHA-256).
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
    t_bits = table[True].view(torch.int32).cpu().numpy().view(np.uint32)
    ref = np.log2(1.0 + np.arange(NGRID, dtype=np.float64) * 2.0**-23).astype(np.float32).view(np.uint32)
    corr = t_bits.astype(np.int64) - ref.astype(np.int64)
    res["table_correction_range"] = [int(corr.min()), int(corr.max())]
    np.savez_compressed(
        out / "lg2.npz", correction=corr.astype(np.int32), sha256=np.array(hashlib.sha256(t_bits.tobytes()).hexdigest())
    )
    # every positive normal input against fl(e + T[k]), per exponent
    mism = {}
    first = []
    for ftz in (True, False):
        bad_by_e = np.zeros(256, np.int64)
        for start in range(0x00800000, 0x7F800000, CHUNK):
            stop = min(start + CHUNK, 0x7F800000)
            bits = torch.arange(start, stop, device=dev, dtype=torch.int64)
            x = bits.to(torch.int32).view(torch.float32)
            y = lg2(kern, x, ftz)
            e = ((bits >> 23) - 127).to(torch.float32)
            pred = e + table[ftz][(bits & 0x7FFFFF)]
            bad = y.view(torch.int32) != pred.view(torch.int32)
            if bad.any():
                be = (bits[bad] >> 23).cpu().numpy()
                bad_by_e += np.bincount(be, minlength=256)
                if len(first) < 16:
                    idx = torch.nonzero(bad)[:4, 0]
                    first += [
                        [
                            f"{int(bits[i]):#010x}",
                            f"{int(y.view(torch.int32)[i]) & 0xFFFFFFFF:#010x}",
                            f"{int(pred.view(torch.int32)[i]) & 0xFFFFFFFF:#010x}",
                        ]
                        for i in idx
                    ]
        mism["ftz" if ftz else "noftz"] = {
            "total": int(bad_by_e.sum()),
            "by_biased_exponent": {int(i): int(v) for i, v in enumerate(bad_by_e) if v},
        }
    res["hypothesis_e_plus_table"] = mism
    res["first_mismatches"] = first
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
