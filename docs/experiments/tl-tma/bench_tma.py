"""Forward-kernel variants that keep the committed bits, against the committed tl and overlap kernels: bits
first (O and LSE against the committed tl kernel on randn, repeated, large, sink and random inputs, ragged
lengths included), then paired timing (benchmarks/fix_cost.py's rounds; every kernel and softmax of a shape
as a CUDA graph of 8 forwards, all in one rotation).  ``--impls`` (the first must be ``tl``):

- ``tl[:S[:M]]``: the committed tl kernel, optionally with S stages and M query rows (M / 16 warps);
- ``tma[:S[:M]]``: the same with K/V by TMA (fwd_tma.patch here);
- ``overlap``: the committed overlap kernel (d=128);
- ``ov3[:S[:M]]``: ../overlap-3wg/fwd_overlap3.patch, three compute warpgroups (d=128, no causal masking).

On the GPU machine, from the repository root:

    OUT=$OUT PYTHONPATH=. python docs/experiments/tl-tma/bench_tma.py [--shapes 128x4096,...] [--causal no,yes]
        [--impls tl,tma,tma:2,overlap] [--rounds 15] [--json NAME]
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

import experiment_runs  # noqa: E402
from kernel_variants import patched  # noqa: E402

SOFTMAXES = ("standard", "stabilised", "robust")


IMPLS = ["tl", "tma", "tma:2", "overlap"]


def impls(d: int, causal: bool) -> dict:
    """name -> forward(q, k, v, softmax) for the kernels of IMPLS at this shape.  A name ``tl:S`` or
    ``tma:S`` runs that kernel with S stages, ``tl:S:M`` / ``tma:S:M`` also with M query rows and M // 16
    warps (the committed tiles otherwise)."""
    from gpu import flash
    from gpu.configs import FWD_CONFIGS, Config
    cfg = FWD_CONFIGS[(d, causal)]
    out = {}
    for name in IMPLS:
        kind, *opts = name.split(":")
        stages = int(opts[0]) if opts else cfg.num_stages
        bm = int(opts[1]) if len(opts) > 1 else cfg.block_m
        c = Config(bm, cfg.block_n, bm // 16 if len(opts) > 1 else cfg.num_warps, stages)
        if kind == "tl":
            out[name] = (lambda q, k, v, sm, c=c: flash.forward(q, k, v, causal=causal, softmax=sm, config=c,
                                                                kernel="triton")[:2])
        elif kind == "tma":
            out[name] = (lambda q, k, v, sm, c=c: patched("fwd_tma", "gpu/kernels/fwd.py",
                                                           "docs/experiments/tl-tma/fwd_tma.patch").forward_tma(
                q, k, v, causal, sm, c))
        elif kind == "ov3" and d == 128:  # docs/experiments/overlap-3wg: [stages[:block_m]]
            out[name] = (lambda q, k, v, sm, o=opts: patched(
                "fwd_overlap3", "gpu/kernels/fwd_overlap.py", "docs/experiments/overlap-3wg/fwd_overlap3.patch"
            ).forward3(q, k, v, causal, sm, int(o[1]) if len(o) > 1 else 192, int(o[0]) if o else 2))
        elif kind == "overlap" and d == 128:
            out[name] = lambda q, k, v, sm: flash.forward(q, k, v, causal=causal, softmax=sm, kernel="overlap")[:2]
    return out


def warm(args) -> str:
    d, causal, name, names = args
    IMPLS[:] = names
    import torch
    fn = impls(d, causal).get(name)
    for n in (4096, 1000) if fn else ():
        q = torch.randn((1, 1, n, d), device="cuda", dtype=torch.bfloat16)
        for sm in SOFTMAXES:
            fn(q, q, q, sm)
    torch.cuda.synchronize()
    return f"{args} compiled"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128x4096,128x16384,64x4096")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default="tl_tma.json")
    ap.add_argument("--impls", default=",".join(IMPLS), help="kernels to compare with the committed tl kernel "
                    "(the first, 'tl', is the bits' reference): tl[:S[:M]], tma[:S[:M]], overlap, ov3[:S[:M]]")
    a = ap.parse_args()
    IMPLS[:] = a.impls.split(",")
    shapes, causals = experiment_runs.shapes(a.shapes), experiment_runs.maskings(a.causal)
    experiment_runs.compile_in_pool(warm, [(d, c, name, list(IMPLS)) for d in sorted({d for d, _ in shapes})
                                           for c in causals for name in IMPLS])
    import fix_cost
    import torch

    from gpu.run_attention import cuda_graph, kind_inputs, rand
    bits = experiment_runs.BitTally()
    for d in sorted({d for d, _ in shapes}):
        for kind, n in (("randn", 4096), ("repeated", 4096), ("repeated", 1000), ("large", 1000), ("sink", 1000),
                        ("random", 333)):
            shape = (2, 4, n, d)
            q, k, v = rand(shape, torch.bfloat16) if kind == "randn" else kind_inputs(kind, "bf16", shape, 3)[:3]
            for causal in causals:
                fns = impls(d, causal)
                for sm in SOFTMAXES:
                    ref = fns["tl"](q, k, v, sm)
                    for name, fn in fns.items():
                        if name == "tl" or (name == "overlap" and n < 1000):
                            continue
                        bits.check(fn(q, k, v, sm), ref, d, kind, n, causal, sm, name)
    print(bits.line("the committed tl kernel"), flush=True)
    rows = []
    print("| d | N | causal | kernel | standard | stabilised | robust | stab cost | robust cost |")
    for d, n in shapes:
        q, k, v = rand((4, 32, n, d), torch.bfloat16)
        flops = fix_cost.fwd_flops(4, 32, n, d, False)
        for causal in causals:
            fl = flops / 2 if causal else flops
            fns = impls(d, causal)
            launch = {}
            for name, fn in fns.items():
                for sm in SOFTMAXES:
                    def call(fn=fn, sm=sm, qkv=(q, k, v)):
                        return fn(*qkv, sm)
                    launch[(name, sm)] = cuda_graph(call, 8).replay
            for run in launch.values():
                run()
            ms = fix_cost.paired_rounds(launch, a.rounds, 8)
            for name in fns:
                t = {sm: fl / statistics.median(ms[(name, sm)]) / 1e9 for sm in SOFTMAXES}
                cost = {sm: statistics.median(100 * (1 - s / f) for s, f in zip(ms[(name, "standard")], ms[(name, sm)],
                                                                                     strict=True))
                        for sm in SOFTMAXES[1:]}
                rows.append(dict(d=d, n=n, causal=causal, kernel=name, tflops=t, cost=cost,
                                 ms={sm: ms[(name, sm)] for sm in SOFTMAXES}))
                print(f"| {d} | {n} | {causal} | {name} | {t['standard']:.0f} | {t['stabilised']:.0f} | "
                      f"{t['robust']:.0f} | {cost['stabilised']:+.1f}% | {cost['robust']:+.1f}% |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), a.json), "w") as f:
        json.dump({"env": fix_cost.env(), "bits": bits.record(), "rows": rows}, f)


if __name__ == "__main__":
    main()
