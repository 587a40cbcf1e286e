"""The FP8 forward kernel's cast_sum row sum by packed conversions, compiled for the H100/H200 without a GPU, and
its SASS read for the bug that made l NaN on the GPU: do the E4M3 values the row sum unpacks come from the packs?

    python -m studies.fp8_unpack_sass [--widen packed,swapped,arith] [--head-dim 64] [--keep DIR]

cast_sum's l in the FP8 kernel sums P rounded to E4M3 and widened back (`gpu.kernels.steps.weights`).  The kernels
compute those values arithmetically (`e4m3_values`, 'arith').  A packed conversion ('packed': `cvt.rn.satfinite.
e4m3x2.f32`, `cvt.rn.f16x2.e4m3x2`, `cvt.f32.f16` in one inline asm) is exact on its own
(`studies.device.e4m3_widened`) and cheaper, but in the kernel gave NaN row sums on half the rows.  Its first
instruction is the very conversion that packs P for the P V product, and ptxas merges the two; the SASS then
unpacks E4M3 pairs from registers no pack wrote (loop-carried, or pointers): that is what the GPU summed.
'swapped' converts the pair in the other order (a different instruction, not merged) and unpacks the halves
swapped: the same values, every unpack reading a pack.

Each variant is compiled by Triton for sm_90a here (its bundled ptxas), disassembled by the bundled cuobjdump, and
reported: E4M3 packs, unpacks, and unpacks whose source register was last written by something other than a pack
(0 is sound).  Needs Triton 3.6 (the pinned version); no GPU.  Exit status 1 where 'swapped' or 'arith' reads a
register no pack wrote.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from flashsim.console import ArgumentParser, UsageError, run_command

WIDENINGS = ("packed", "swapped", "arith")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/\s+(.*?)\s*;")


def packed_widening():
    """The first packed widening tried, as a Triton function (the asm text literal: a JIT function reads no
    closure): two float32 values ($2, $3) rounded to E4M3 by one packed conversion, in the order of P's own cast for
    P V, widened back through fp16.  The kernels' own is the other order (`gpu.kernels.steps.e4m3_widened`)."""
    import triton
    import triton.language as tl

    @triton.jit
    def packed(p):
        return tl.inline_asm_elementwise(
            "{ .reg .b16 e, lo, hi; .reg .b32 w; cvt.rn.satfinite.e4m3x2.f32 e, $3, $2; cvt.rn.f16x2.e4m3x2 w, e;"
            " mov.b32 {lo, hi}, w; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
            "=r,=r,r,r",
            [p],
            dtype=tl.float32,
            is_pure=True,
            pack=2,
        )

    return packed


def compile_fp8_forward(widen: str, head_dim: int) -> bytes:
    """The cubin of `gpu.kernels.fwd.attn_fwd` for E4M3 inputs, cast_sum, P V promoted, compiled for sm_90a with
    cast_sum's widened values from `widen` (one of WIDENINGS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gpu.configs import fwd_config
    from gpu.kernels import fwd, steps

    scope = steps.weights.fn.__globals__
    original = scope["e4m3_values"]
    if widen == "packed":
        scope["e4m3_values"] = packed_widening()
    cfg = fwd_config("e4m3", head_dim, False)
    signature = {
        "Q": "*fp8e4nv",
        "K": "*fp8e4nv",
        "V": "*fp8e4nv",
        "O": "*bf16",
        "LSE": "*fp32",
        "DBG": fwd.DebugOutputs(*(("*fp32",) * 4)),
        "consts": steps.SoftmaxConstants(*(("fp32",) * len(steps.SoftmaxConstants._fields))),
        "N_Q": "i32",
        "N_K": "i32",
        "N_BLK": "i32",
        "N_VT": "i32",
    }
    constexprs = {
        "HEAD_DIM": head_dim,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "CAUSAL": False,
        "SOFTMAX": 3,  # cast_sum
        "DEBUG": False,
        "STAGES": cfg.num_stages,
        "V_T": True,
        "PROMOTE_PV": True,
        "E4M3_PACKED": widen == "swapped",  # the kernels' Config(e4m3_sum='packed')
    }
    signature |= dict.fromkeys(constexprs, "constexpr")
    try:
        src = ASTSource(fn=fwd.attn_fwd, signature=signature, constexprs=constexprs)
        options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]
    finally:
        scope["e4m3_values"] = original


def compiled_apart(widen: str, head_dim: int) -> bytes:
    """`compile_fp8_forward` in a process of its own with an empty Triton cache: a JIT function hashes its callees
    once per process, so a second variant compiled in the same one would come back from the first's cache."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    with tempfile.TemporaryDirectory(prefix="fp8_unpack_sass_") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(compile_fp8_forward, widen, head_dim).result()


def sass_of(cubin: bytes) -> list[str]:
    """The instructions of a cubin, in order, as the cuobjdump Triton carries prints them."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-sass", f.name], check=True, capture_output=True, text=True).stdout
    return _INSTRUCTION.findall(text)


def unpack_sources(sass: list[str]) -> dict:
    """E4M3 packs and unpacks, and the unpacks whose source register was last written (earlier in program order)
    by something other than a pack, with that instruction (None: not written before)."""
    packs = sum(i.startswith("F2FP.SATFINITE.E4M3") for i in sass)
    unpacks, strays = 0, []
    for n, ins in enumerate(sass):
        m = re.match(r"F2FP\.F16\.E4M3\.UNPACK_B R\d+, (R\d+)$", ins)
        if not m:
            continue
        unpacks += 1
        src = m.group(1)
        writer = next((sass[j] for j in range(n - 1, -1, -1) if re.match(rf"\S+ {src}\b,", sass[j])), None)
        if writer is None or not writer.startswith("F2FP.SATFINITE.E4M3"):
            strays.append({"unpack": ins, "last_written_by": writer})
    return {"packs": packs, "unpacks": unpacks, "strays": strays}


def run(args) -> int:
    widen = [w.strip() for w in args.widen.split(",") if w.strip()]
    unknown = sorted(set(widen) - set(WIDENINGS))
    if not widen or unknown:
        raise UsageError(f"--widen: expected a comma list of {', '.join(WIDENINGS)}, got {args.widen!r}")
    if args.head_dim not in (64, 128):
        raise UsageError(f"--head-dim: expected 64 or 128, got {args.head_dim}")
    try:
        import triton
    except ImportError:
        raise UsageError("triton: not installed; this study compiles the kernel with it (triton==3.6.0)") from None
    print(f"Triton {triton.__version__}, sm_90a, head dim {args.head_dim}, the FP8 cast_sum forward (tl kernel)")
    print("| widening | E4M3 packs | unpacks | unpacks reading no pack |")
    print("|---|---:|---:|---:|")
    unsound = False
    for w in widen:
        cubin = compiled_apart(w, args.head_dim)
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            (Path(args.keep) / f"fp8_{w}_d{args.head_dim}.cubin").write_bytes(cubin)
        r = unpack_sources(sass_of(cubin))
        print(f"| {w} | {r['packs']} | {r['unpacks']} | {len(r['strays'])} |")
        for s in r["strays"][:3]:
            print(f"  {s['unpack']}  <- last written by: {s['last_written_by'] or 'nothing before it'}")
        unsound |= w != "packed" and bool(r["strays"])
    return 1 if unsound else 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.fp8_unpack_sass", description=__doc__.split("\n")[0])
    ap.add_argument("--widen", default="packed,swapped,arith", help="comma list of packed, swapped, arith")
    ap.add_argument("--head-dim", type=int, default=64, help="64 or 128 (default 64)")
    ap.add_argument("--keep", help="a folder for the cubins")
    args = ap.parse_args(argv)
    return run_command("fp8_unpack_sass", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
