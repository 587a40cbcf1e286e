"""The FP8 E4M3 forward with V as given, (N, d), against V with its keys contiguous, (d, N), in one process:
bits, then paired timings.

On the GPU machine, from the repository root:

    OUT=$OUT PYTHONPATH=. python docs/experiments/fp8-vt/bench_fp8.py [--shapes 128x4096,128x16384,64x4096]
        [--causal no,yes] [--impls nk,vt,bf16] [--rounds 10] [--json fp8_vt.json]

Impls (each optionally ':BLOCK_M:BLOCK_N:warps:stages', else the committed tiles):

- ``nk``: the tl kernel on FP8 with V as (N, d) (``V_T=False``), what ``flash.forward`` ran before
  (``gpu.flash.V_TRANSPOSED`` emptied);
- ``vt``: ``flash.forward`` as committed: V transposed on every call (``gpu.kernels.fwd.transpose_keys``),
  then the kernel (``V_T=True``);
- ``ov``: the Gluon overlap kernel (``kernel='overlap'``) on FP8, V transposed as for ``vt`` (its warps
  are fixed: ':BM:BN:W:S' sets BLOCK_M, BLOCK_N = d and the stages; W is ignored);
- ``bf16``: ``flash.forward`` on the same values in bf16 (the kernel ``auto`` picks), for scale.

Every FP8 impl is first checked to give the bits of ``nk`` (O and LSE; randn, repeated, large and sink
inputs, ragged lengths, both maskings, three softmaxes): with the committed tiles, or an impl with other
tiles against ``nk`` on the same query and key tiles (BLOCK_M // 16 warps), as the tiles decide which blocks
take the causal diagonal's arithmetic; then the impls are timed
by benchmarks/fix_cost.py's paired rounds (each impl and softmax a CUDA graph of enough forwards for ~3 ms,
the order rotated from round to round).  Writes $OUT/JSON.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

import experiment_runs  # noqa: E402

SOFTMAXES = ("standard", "stabilised", "robust")
B, H = 4, 32


def parse(impl: str):
    """'vt:128:128:8:2' -> ('vt', Config(128, 128, 8, 2)); 'vt' -> ('vt', None)."""
    from gpu.configs import Config
    name, *tiles = impl.split(":")
    if name not in ("nk", "vt", "ov", "bf16"):
        raise ValueError(f"--impls: nk, vt, ov or bf16, optionally :BM:BN:W:S; got {impl!r}")
    return name, (Config(*map(int, tiles)) if tiles else None)


def forward(impl: str, q8, k8, v8, causal: bool, sm: str):
    """(O, LSE) of ``impl`` on e4m3 q8, k8, v8."""
    import torch

    from gpu import flash
    name, cfg = parse(impl)
    if name == "bf16":  # time_shape passes bf16 copies, so that the casts stay out of the timing
        return flash.forward(*(x.to(torch.bfloat16) for x in (q8, k8, v8)), causal=causal, softmax=sm)[:2]
    flash.V_TRANSPOSED = () if name == "nk" else (flash.FP8,)
    try:
        return flash.forward(q8, k8, v8, causal=causal, softmax=sm, config=cfg,
                             kernel="overlap" if name == "ov" else "triton")[:2]
    finally:
        flash.V_TRANSPOSED = (flash.FP8,)


def reference(impl: str) -> str:
    """The impl whose bits ``impl`` must give: ``nk`` on the same query and key tiles."""
    cfg = parse(impl)[1]
    return "nk" if cfg is None else f"nk:{cfg.block_m}:{cfg.block_n}:{max(4, cfg.block_m // 16)}:{cfg.num_stages}"


def warm(args) -> str:
    """Compile one impl's kernels for one head dim and masking (run in a pool: Triton caches them on disk)."""
    impl, d, causal = args
    if parse(impl)[0] == "bf16":
        return f"{args} skipped"
    if reference(impl) != impl:
        warm((reference(impl), d, causal))
    import torch

    from gpu import flash
    for n in (4096, 1000):
        q = torch.randn((1, 1, n, d), device="cuda").to(flash.FP8)
        for sm in SOFTMAXES:
            forward(impl, q, q, q, causal, sm)
    torch.cuda.synchronize()
    return f"{args} compiled"


def time_shape(impls, d: int, n: int, causal: bool, rounds: int) -> dict:
    import fix_cost
    import torch

    from gpu import flash
    from gpu.run_attention import cuda_graph, fwd_flops, rand
    f8 = tuple(x.to(flash.FP8) for x in rand((B, H, n, d), torch.float32))
    bf = tuple(x.to(torch.bfloat16) for x in f8)
    fns = {(i, sm): (lambda i=i, sm=sm: forward(i, *(bf if parse(i)[0] == "bf16" else f8), causal, sm))
           for i in impls for sm in SOFTMAXES}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fns[(impls[0], "standard")]()
    torch.cuda.synchronize()
    reps = max(1, min(64, round(fix_cost.TARGET_MS / max(1e-3, 1e3 * (time.perf_counter() - t0)))))
    graphs = {key: cuda_graph(fn, reps) for key, fn in fns.items()}
    for g in graphs.values():
        g.replay()
    ms = fix_cost.paired_rounds({key: g.replay for key, g in graphs.items()}, rounds, reps)
    flops = fwd_flops(B, H, n, d, causal)
    tflops = {f"{i}/{sm}": flops / statistics.median(ms[(i, sm)]) / 1e9 for i, sm in fns}
    return {"d": d, "n": n, "causal": causal, "reps": reps, "tflops": tflops,
            "ms": {f"{i}/{sm}": v for (i, sm), v in ms.items()}}


def transpose_ms(d: int, n: int) -> dict:
    """Median ms of V's transpose on a (B, H, n, d) e4m3 tensor: gpu.flash._keys_contiguous (a Triton
    kernel) and torch's strided copy (what the first version of this change used)."""
    import torch

    from gpu import flash
    v8 = torch.randn((B, H, n, d), device="cuda").to(flash.FP8)
    vt = torch.empty((B, H, d, n), device="cuda", dtype=flash.FP8)
    out = {}
    for name, fn in (("triton", lambda: flash._keys_contiguous(v8)), ("torch", lambda: vt.copy_(v8.transpose(-1, -2)))):
        ends = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            ends.append((s, e))
        torch.cuda.synchronize()
        out[name] = statistics.median(s.elapsed_time(e) for s, e in ends[2:])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="128x4096,128x16384,64x4096", help="d x N, comma-separated")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--impls", default="nk,vt,bf16")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", default="fp8_vt.json", help="file name under $OUT")
    a = ap.parse_args(argv)
    shapes, causals = experiment_runs.shapes(a.shapes), experiment_runs.maskings(a.causal)
    impls = a.impls.split(",")
    for impl in impls:
        parse(impl)
    experiment_runs.compile_in_pool(warm, [(i, d, c) for i in impls for d in sorted({d for d, _ in shapes})
                                           for c in causals])
    import fix_cost
    import torch

    from gpu import flash
    from gpu.run_attention import kind_inputs, rand
    fp8 = [i for i in impls if parse(i)[0] != "bf16"]
    bits = experiment_runs.BitTally()
    tiles = {}  # impl with other tiles -> its tally: other tiles may change the bits, so they are counted apart
    for d in sorted({d for d, _ in shapes}):
        for kind, nq, nk in (("randn", 4096, 4096), ("repeated", 1000, 1000), ("large", 1000, 777),
                             ("sink", 777, 1000), ("randn", 130, 70), ("randn", 64, 1)):
            shape = (2, 4, max(nq, nk), d)
            if kind == "randn":
                q, k, v = rand(shape, torch.float32)
            else:
                q, k, v, _ = kind_inputs(kind, "bf16", shape, 3)
            q8 = q[:, :, :nq].to(flash.FP8).contiguous()
            k8, v8 = (x[:, :, :nk].to(flash.FP8).contiguous() for x in (k, v))
            for causal in causals:
                for sm in SOFTMAXES:
                    refs = {ref: forward(ref, q8, k8, v8, causal, sm) for ref in {reference(i) for i in fp8}}
                    for impl in fp8:
                        tally = tiles.setdefault(impl, experiment_runs.BitTally("other bits:")) \
                            if parse(impl)[1] is not None else bits
                        tally.check(forward(impl, q8, k8, v8, causal, sm), refs[reference(impl)], impl, d, kind,
                                    nq, nk, causal, sm)
    print(bits.line("'nk'"), flush=True)
    for impl, tally in tiles.items():
        print(f"with other tiles, {impl}: {tally.line(repr(reference(impl)))}", flush=True)
    rows = []
    for d, n in shapes:
        for causal in causals:
            row = time_shape(impls, d, n, causal, a.rounds)
            row["transpose_ms"] = transpose_ms(d, n)
            rows.append(row)
            tf = row["tflops"]
            tms = row["transpose_ms"]
            print(f"d={d} N={n} causal={causal} (V's transpose alone: {tms['triton']:.3f} ms; torch's copy "
                  f"{tms['torch']:.3f} ms)", flush=True)
            for sm in SOFTMAXES:
                cells = (f"{i} {tf[f'{i}/{sm}']:.0f} ({tf[f'{i}/{sm}'] / tf[f'{impls[0]}/{sm}']:.2f}x)" for i in impls)
                print(f"  {sm:10s} " + "  ".join(cells), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), a.json), "w") as f:
        json.dump({"env": fix_cost.env(), "command": " ".join(sys.argv), "impls": impls,
                   "bits": bits.record() | {"other_tiles": {i: [t.identical, t.runs] for i, t in tiles.items()}},
                   "rows": rows}, f)


if __name__ == "__main__":
    main()
