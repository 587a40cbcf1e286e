"""A candidate for the FP8 kernel's cast_sum row sum, checked on its own and in the kernel: P rounded to E4M3 and
widened back to float32 by packed conversions (`cvt.rn.satfinite.e4m3x2.f32`, `cvt.rn.f16x2.e4m3x2`, then
`cvt.f32.f16`: four instructions for two values, where `gpu.kernels.steps.e4m3_values` takes about ten float32 and
integer operations a value), against two casts it shares no code with: every float32 in [0, 1] (the range of P)
equal to torch's CUDA cast (`x.to(torch.float8_e4m3fn)`, c10's conversion) and, on every 64th value, to ml_dtypes'
on the CPU.

`--form packed` (`studies.fp8_unpack_sass.packed_widening`) is the pair in the order of P's own cast for P V: inside
the tl forward kernel it gave NaN row sums on rows 0-7, 16-23, 32-39, ... of every 64-row tile, because ptxas merges
its first conversion with that cast and then unpacks half the pairs from registers no pack wrote
(`python -m studies.fp8_unpack_sass`).  `--form swapped` is the kernels' own (`gpu.kernels.steps.e4m3_widened`, run
by `Config(e4m3_sum="packed")`): the pair the other way round, not merged.  With it the study also runs the FP8
cast_sum forward (`gpu.flash.forward`, P V promoted) with both `e4m3_sum` settings on the same inputs, d 64 and
128, causal and not, 1 to 4096 keys, every input kind, and compares O's and the LSE's bits.

    PYTHONPATH=. python -m studies.device.e4m3_widened --out $OUT [--form packed|swapped]

Writes `e4m3_widened.json`: the device, the versions, how many values were compared and how many differ (with the
first few that do), and with `swapped` the kernel launches compared and those whose bits differ.
"""

from __future__ import annotations

import json
import time

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir
from gpu.commands import require_gpu

CHUNK = 1 << 26
LAST = 0x3F800000  # the bits of 1.0: every float32 from +0 to 1 is one of 0 .. LAST


def run(args) -> int:
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.e4m3_widened")
    import ml_dtypes
    import torch
    import triton
    import triton.language as tl

    if args.form == "swapped":
        from gpu.kernels.steps import e4m3_widened
    else:
        from studies.fp8_unpack_sass import packed_widening

        e4m3_widened = packed_widening()

    @triton.jit
    def widen(X, Y, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, e4m3_widened(tl.load(X + offs)))

    t0 = time.monotonic()
    compared = sampled = 0
    differ: list[dict] = []
    for start in range(0, LAST + 1, CHUNK):
        bits = torch.arange(start, min(start + CHUNK, LAST + 1), device="cuda", dtype=torch.int64).to(torch.int32)
        n = bits.numel()
        pad = -n % 1024
        x = torch.cat([bits, bits.new_zeros(pad)]).view(torch.float32)
        y = torch.empty_like(x)
        widen[(x.numel() // 1024,)](x, y, BLOCK=1024)
        want = x.to(torch.float8_e4m3fn).to(torch.float32)
        bad = torch.nonzero(y[:n].view(torch.int32) != want[:n].view(torch.int32)).flatten()
        compared += n
        for i in bad[:5].tolist():
            differ.append({"x": float(x[i]), "got": float(y[i]), "torch": float(want[i])})
        differ_n = int(bad.numel())
        if differ_n > 5:
            differ.append({"more": differ_n - 5})
        xs = x[:n:64].cpu().numpy()
        ys = y[:n:64].cpu().numpy()
        ref = xs.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        off = np.flatnonzero(ys.view(np.uint32) != ref.view(np.uint32))
        sampled += xs.size
        for i in off[:5]:
            differ.append({"x": float(xs[i]), "got": float(ys[i]), "ml_dtypes": float(ref[i])})
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "command": f"PYTHONPATH=. python -m studies.device.e4m3_widened --out $OUT --form {args.form}",
        "form": args.form,
        "compared_with_torch": compared,
        "compared_with_ml_dtypes": sampled,
        "differ": differ,
    }
    if args.form == "swapped":
        res["kernel"] = kernel_bits()
    res["seconds"] = round(time.monotonic() - t0, 1)
    (out / "e4m3_widened.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"e4m3_widened: {compared} values against torch, {sampled} against ml_dtypes, {len(differ)} differ")
    kernel = res.get("kernel", {})
    if kernel:
        print(f"e4m3_widened: {kernel['launches']} FP8 cast_sum launches, {len(kernel['differ'])} with other bits")
    return 1 if differ or kernel.get("differ") else 0


def kernel_bits() -> dict:
    """The FP8 cast_sum forward with `Config.e4m3_sum` 'arith' and 'packed' on the same inputs (seeds from
    SEED, `flashsim.inputs.make_heads`, every kind in turn): launches compared, and those whose O or LSE bits
    differ."""
    import dataclasses

    import torch

    from flashsim.inputs import case_kinds, make_heads
    from gpu import flash
    from gpu.configs import fwd_config

    launches, differ = 0, []
    for i, (n, heads, d, causal) in enumerate(KERNEL_CASES):
        x = make_heads(case_kinds({"first_kind": i}), heads, n, n, d, "e4m3", SEED + 100 * i)
        q, k, v = (torch.from_numpy(x[name]).cuda().to(flash.FP8)[None] for name in "qkv")
        outs = []
        for how in ("arith", "packed"):
            cfg = dataclasses.replace(fwd_config("e4m3", d, causal), e4m3_sum=how)
            o, lse, _ = flash.forward(q, k, v, causal=causal, softmax="cast_sum", config=cfg, kernel="triton")
            outs.append((o.view(torch.int16).cpu(), lse.view(torch.int32).cpu()))
        launches += 1
        same = all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
        if not same:
            differ.append({"n": n, "heads": heads, "d": d, "causal": causal, "seed": SEED + 100 * i})
    return {"launches": launches, "differ": differ, "seed": SEED, "cases": [list(c) for c in KERNEL_CASES]}


SEED = 2_026_120_400
#: (keys, heads) and (keys, heads, head dim, causal) of the kernel comparison
SHAPES = ((1, 4), (100, 8), (333, 4), (1000, 4), (4096, 2))
KERNEL_CASES = tuple((n, h, d, c) for n, h in SHAPES for d in (64, 128) for c in (False, True))


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.e4m3_widened", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument(
        "--form",
        choices=("packed", "swapped"),
        default="packed",
        help="the pair in the order of P's cast (the study's), or the other way round (the kernels'; default packed)",
    )
    args = ap.parse_args(argv)
    return run_command("e4m3_widened", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
