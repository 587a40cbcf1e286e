"""Compile every probe kernel for a GPU architecture without a GPU, and check the instructions it lowers to.

`python -m studies.probes.compile_check [--arch 90] [--quick] [--json FILE]` (needs triton, which bundles ptxas;
no GPU and no torch CUDA needed). For each kernel variant the probes launch it records the PTX and SASS
mnemonics of interest and checks the expectations below; the exit code is 1 if a kernel fails to compile or an
expectation fails. This is a pre-flight check before the one run on the H100 (and a record of what the
compiler does for sm_90 on a machine without one).

Expectations: tl.math.exp2 -> ex2.approx.ftz.f32; tl.exp -> mul.f32 by 0f3FB8AA3B then ex2.approx.f32; a / b ->
div.full.f32; tl.math.div_rn -> div.rn.f32; every tl.dot variant -> wgmma.mma_async with the input type of the
variant (k16 for 16-bit, k32 for fp8); the reduction kernels with VIA_DOT -> wgmma.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from .common import jsonable

PTX_RE = re.compile(
    r"(?<![\w.])(ex2\.approx[\w.]*|div\.[\w.]*f32|rcp\.[\w.]*|fma\.rn[\w.]*|mul\.[\w.]*f32|wgmma\.mma_async[\w.]*|"
    r"mma\.sync[\w.]*|shfl\.sync[\w.]*|bar\.sync)"
)
SASS_RE = re.compile(r"\b(MUFU\.\w+|HGMMA\.[\w.]*|QGMMA\.[\w.]*|HMMA\.[\w.]*|FCHK|SHFL\.\w+|CALL\.\w+)")
WGMMA_TYPE = {"bf16": ".bf16.bf16", "fp16": ".f16.f16", "e4m3": ".e4m3.e4m3", "e5m2": ".e5m2.e5m2"}
PTR = {"bf16": "*bf16", "fp16": "*fp16", "e4m3": "*fp8e4nv", "e5m2": "*fp8e5"}


def _mnemonics(text: str, rx: re.Pattern) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        s = line.strip()
        if s.startswith("//"):
            continue
        for m in rx.findall(s.split("//")[0] if not s.startswith("/*") else s):
            out[m] = out.get(m, 0) + 1
    return dict(sorted(out.items()))


def variants(quick: bool = False) -> list[dict]:
    """(kernel, signature, constexprs, num_warps, expectation) for every kernel variant the probes launch."""
    from . import division, exp2, mma, reduction

    f32io = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}
    out = [
        {"name": "exp2", "fn": exp2._exp2_kernel, "sig": f32io, "const": {"BLOCK": 1024},
         "expect": ["ex2.approx.ftz.f32"]},
        {
            "name": "exp",
            "fn": exp2._exp_kernel,
            "sig": f32io,
            "const": {"BLOCK": 1024},
            "expect": ["mul.f32", "ex2.approx.f32"],
            "expect_text": ["0f3FB8AA3B"],
        },
        {"name": "ex2_ftz_asm", "fn": exp2._ex2_asm_kernel, "sig": f32io, "const": {"FTZ": True, "BLOCK": 1024},
         "expect": ["ex2.approx.ftz.f32"]},
        {"name": "ex2_asm", "fn": exp2._ex2_asm_kernel, "sig": f32io, "const": {"FTZ": False, "BLOCK": 1024},
         "expect": ["ex2.approx.f32"]},
    ]  # fmt: skip
    div_expect = {"div": "div.full.f32", "div_rn": "div.rn.f32", "asm_div_full": "div.full.f32",
                  "asm_div_approx": "div.approx.f32", "rcp_ftz_mul": "rcp.approx.ftz.f32",
                  "rcp_mul": "rcp.approx.f32"}  # fmt: skip
    models = division.MODELS[:3] if quick else division.MODELS
    for i, m in enumerate(models):
        out.append(
            {
                "name": f"div/{m}",
                "fn": division._div_model_kernel,
                "sig": {"a_ptr": "*fp32", "b_ptr": "*fp32", "q_ptr": "*fp32", "n": "i32"},
                "const": {"MODEL": i, "BLOCK": 1024},
                "expect": [div_expect[m]] if m in div_expect else [],
            }
        )
    for fmt in ("bf16", "fp16", "e4m3", "e5m2"):
        ks = (mma.PROBE_K,) if quick else tuple(sorted(set(mma.STRESS_K[fmt]) | {mma.PROBE_K}))
        for K in ks:
            for has_c in (False, True):
                maxis = (0, 32) if fmt in ("e4m3", "e5m2") and K == mma.PROBE_K else (0,)
                for maxi in maxis:
                    kstep = "k32" if fmt in ("e4m3", "e5m2") else "k16"
                    out.append(
                        {
                            "name": f"dot/{fmt}_K{K}_{'c' if has_c else 'noc'}_maxi{maxi}",
                            "fn": mma._dot_tile_kernel,
                            "sig": {"a_ptr": PTR[fmt], "b_ptr": PTR[fmt], "c_ptr": "*fp32", "d_ptr": "*fp32"},
                            "const": {"K": K, "HAS_C": has_c, "MAXI": maxi, "BT": 1},
                            "num_warps": mma.NUM_WARPS,
                            "expect_regex": [rf"wgmma\.mma_async\S*m64n\d+{kstep}\S*{re.escape(WGMMA_TYPE[fmt])}"],
                        }
                    )
    configs = reduction.CONFIGS[:2] if quick else reduction.CONFIGS
    for bm, bn, w in configs:
        for via_dot, store_d in ((True, False), (True, True), (False, False)):
            out.append(
                {
                    "name": f"reduce/BM{bm}_BN{bn}_w{w}_{'dot' if via_dot else 'load'}{'_stored' if store_d else ''}",
                    "fn": reduction._row_reduce_kernel,
                    "sig": {
                        "x_ptr": "*fp32",
                        "q_ptr": "*bf16",
                        "k_ptr": "*bf16",
                        "sum_ptr": "*fp32",
                        "max_ptr": "*fp32",
                        "d_ptr": "*fp32",
                    },  # fmt: skip
                    "const": {"BM": bm, "BN": bn, "VIA_DOT": via_dot, "STORE_D": store_d},
                    "num_warps": w,
                    "expect_regex": [r"wgmma\.mma_async"] if via_dot else [],
                }
            )
    return out


def compile_one(v: dict, arch: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(v["sig"])
    sig.update({k: "constexpr" for k in v["const"]})
    rec: dict = {"name": v["name"], "ok": False}
    t0 = time.monotonic()
    try:
        ck = triton.compile(
            ASTSource(fn=v["fn"], signature=sig, constexprs=v["const"]),
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": v.get("num_warps", 4)},
        )
        ptx = ck.asm["ptx"]
        rec["ptx"] = _mnemonics(ptx, PTX_RE)
        try:
            rec["sass"] = _mnemonics(ck.asm["sass"], SASS_RE)
        except Exception as e:  # noqa: BLE001
            rec["sass"] = {"error": repr(e)[:200]}
        failed = [e for e in v.get("expect", []) if e not in rec["ptx"]]
        failed += [e for e in v.get("expect_text", []) if e not in ptx]
        failed += [e for e in v.get("expect_regex", []) if not re.search(e, ptx)]
        rec["expectations_failed"] = failed
        rec["ok"] = not failed
    except Exception as e:  # noqa: BLE001
        rec["error"] = repr(e)[:1000]
    rec["seconds"] = round(time.monotonic() - t0, 3)
    return rec


def run_all(arch: int = 90, quick: bool = False, log=print) -> dict:
    recs = []
    for v in variants(quick):
        r = compile_one(v, arch)
        recs.append(r)
        key = [k for k in r.get("ptx", {}) if k.startswith(("ex2", "div", "rcp", "wgmma", "mma"))]
        log(f"{'ok  ' if r['ok'] else 'FAIL'} {r['name']:<40} {r['seconds']:6.2f}s {' '.join(key)[:120]}"
            + (f"  {r.get('error') or r.get('expectations_failed')}" if not r["ok"] else ""))  # fmt: skip
    return {"arch": arch, "kernels": recs, "failed": [r["name"] for r in recs if not r["ok"]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the records to this file")
    args = ap.parse_args(argv)
    res = run_all(args.arch, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(jsonable(res), f, indent=1)
    print(f"{len(res['kernels']) - len(res['failed'])}/{len(res['kernels'])} kernels compiled as expected")
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
