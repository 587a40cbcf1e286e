"""The backward kernels of this tree against a base commit's and against variants, in one process: bits, then
paired timings.

On the GPU machine, from the repository root (its git must hold the base commit):

    OUT=$OUT PYTHONPATH=. python docs/experiments/bwd-split/bench_bwd.py [--shapes 128x4096,64x4096]
        [--causal no,yes] [--impls old,new,split,one,new:64:64:8:2] [--base ba3ac2a] [--rounds 10]
        [--json bwd_split.json]

An impl is 'new' (this tree's kernels), 'old' (gpu/kernels/bwd.py at ``--base``), a variant (gpu/kernels/bwd.py
with docs/experiments/bwd-split/{name}.patch: 'split', 'one'; loaded by benchmarks/kernel_variants.py) or
'A+B': the dK/dV kernel from A and the dQ kernel from B; optionally followed by ':BLOCK_M:BLOCK_N:warps:stages'
(default: this tree's tiles) and by '|dkdv=...' or '|dq=...' giving one kernel tiles of its own; or 'atomic'
(bwd_atomic.py).

Compiles in 15 processes, checks that every impl but 'atomic' gives the bits of 'new' with the default tiles
(dQ, dK, dV of randn, repeated, large and sink inputs, ragged lengths, both maskings), then times
``flash.backward`` for each impl with benchmarks/fix_cost.py's paired rounds (CUDA graphs, order
rotated) and writes $OUT/JSON.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import experiment_runs  # noqa: E402


def parse(impl: str):
    """'old+new:64:64:8:2' -> (('old', 'new'), Config(64, 64, 8, 2)); 'old' -> (('old', 'old'), None).
    A suffix '|dkdv=BM:BN:W:S' or '|dq=BM:BN:W:S' (see :func:`kernel_tiles`) is not part of it."""
    from gpu.configs import Config
    which, *tiles = impl.split("|")[0].split(":")
    a, _, b = which.partition("+")
    return (a, b or a), (Config(*map(int, tiles)) if tiles else None)


def kernel_tiles(impl: str) -> dict:
    """'new|dkdv=64:128:8:2|dq=128:64:8:2' -> {'dkdv': Config(64, 128, 8, 2), 'dq': Config(128, 64, 8, 2)}:
    one kernel's tiles and launch options instead of the shared config (flashsim's model of the kernels
    gives the same bits for any tiles: docs/experiments/bwd-split/README.md)."""
    from gpu.configs import Config
    out = {}
    for part in impl.split("|")[1:]:
        kern, _, tiles = part.partition("=")
        if kern not in ("dkdv", "dq"):
            raise ValueError(f"--impls: a suffix is |dkdv=BM:BN:W:S or |dq=BM:BN:W:S, got {part!r}")
        out[kern] = Config(*map(int, tiles.split(":")))
    return out


class Retiled:
    """A backward launcher with its own tiles and options: the grid recomputed from them (the dK/dV kernel
    tiles the keys, n_k its last argument; the dQ kernel the queries, n_q the one before)."""

    def __init__(self, launcher, cfg, kern: str) -> None:
        self.launcher, self.cfg, self.kern = launcher, cfg, kern

    def __call__(self, grid, args, constexprs, options) -> None:
        c = self.cfg
        n, block = (args[-1], c.block_n) if self.kern == "dkdv" else (args[-2], c.block_m)
        self.launcher((-(-n // block), grid[1]), args, {**constexprs, "BLOCK_M": c.block_m, "BLOCK_N": c.block_n},
                      dict(num_warps=c.num_warps, num_stages=c.num_stages))


_LAUNCH: dict = {}
_NEW: list = []
BASE = ["ba3ac2a"]  # the commit whose backward is 'old' (--base)


def launchers(src: str):
    """(dK/dV, dQ) launchers: this tree's ('new'), gpu/kernels/bwd.py at the base commit ('old'), or with
    docs/experiments/bwd-split/{src}.patch applied."""
    from kernel_variants import at_commit, patched

    from gpu import flash
    from gpu.launch import Launcher
    if not _NEW:
        _NEW.extend((flash._DKDV, flash._DQ))
    if src == "new":
        return tuple(_NEW)
    if src not in _LAUNCH:
        target = "gpu/kernels/bwd.py"
        mod = (at_commit("bwd_old", BASE[0], target) if src == "old"
               else patched(f"bwd_{src}", target, f"docs/experiments/bwd-split/{src}.patch"))
        _LAUNCH[src] = (Launcher(mod.attn_bwd_dkdv), Launcher(mod.attn_bwd_dq))
    return _LAUNCH[src]


def use(srcs: tuple[str, str]) -> None:
    """Route flash's backward launches: dK/dV from srcs[0], dQ from srcs[1]."""
    from gpu import flash
    flash._DKDV, flash._DQ = launchers(srcs[0])[0], launchers(srcs[1])[1]


def backward(impl: str, q, k, v, o, lse, do, causal: bool):
    from gpu import flash
    if impl == "atomic":  # dQ by atomics (bwd_atomic.py): timed, its bits not compared
        from bwd_atomic import backward_atomic
        return backward_atomic(q, k, v, o, lse, do, causal)
    srcs, cfg = parse(impl)
    use(srcs)
    for kern, kcfg in kernel_tiles(impl).items():
        name = "_DKDV" if kern == "dkdv" else "_DQ"
        setattr(flash, name, Retiled(getattr(flash, name), kcfg, kern))
    try:
        return flash.backward(q, k, v, o, lse, do, causal=causal, config=cfg)[:3]
    finally:
        use(("new", "new"))


def warm(args) -> str:
    import torch

    from gpu import flash
    impl, d, causal, BASE[0] = args
    q = torch.randn((1, 1, 300, d), device="cuda", dtype=torch.bfloat16)
    o, lse, _ = flash.forward(q, q, q, causal=causal, kernel="triton")
    backward(impl, q, q, q, o, lse, q, causal)
    torch.cuda.synchronize()
    return f"{args} compiled"


def time_shape(impls: list[str], d: int, n: int, causal: bool, rounds: int) -> dict:
    """Paired rounds of ``flash.backward`` by each impl at B=4, H=32 (CUDA graphs of 16384 / n calls)."""
    import fix_cost
    import torch

    from gpu import flash
    from gpu.run_attention import cuda_graph, rand
    q, k, v = rand((4, 32, n, d), torch.bfloat16)
    do = torch.randn_like(q)
    o, lse, _ = flash.forward(q, k, v, causal=causal, kernel="triton")
    reps = max(1, 4096 * 4 // n)
    launch = {impl: cuda_graph(lambda impl=impl: backward(impl, q, k, v, o, lse, do, causal), reps).replay
              for impl in impls}
    for run in launch.values():
        run()
    ms = fix_cost.paired_rounds(launch, rounds, reps)
    flops = 2.5 * fix_cost.fwd_flops(4, 32, n, d, causal)
    return dict(d=d, n=n, causal=causal, reps=reps, ms=ms,
                tflops={impl: flops / statistics.median(t) / 1e9 for impl, t in ms.items()})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="128x4096,64x4096", help="d x N, comma-separated")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--impls", default="old,new")
    ap.add_argument("--base", default=BASE[0], help="the commit whose backward is 'old'")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", default="bwd_split.json", help="file name under $OUT")
    a = ap.parse_args(argv)
    BASE[0] = a.base
    shapes, causals = experiment_runs.shapes(a.shapes), experiment_runs.maskings(a.causal)
    impls = a.impls.split(",")
    for impl in impls:
        parse(impl)
    experiment_runs.compile_in_pool(warm, [(impl, d, c, a.base) for impl in impls
                                           for d in sorted({d for d, _ in shapes}) for c in causals])
    import fix_cost
    import torch

    from gpu import flash
    from gpu.run_attention import kind_inputs, rand
    bits = experiment_runs.BitTally()
    for d in sorted({d for d, _ in shapes}):
        same = [i for i in impls if i != "atomic"]  # tiles included: flashsim's model says they change no bit
        for kind, nq, nk in (("randn", 4096, 4096), ("repeated", 1000, 1000), ("large", 1000, 777),
                             ("sink", 777, 1000), ("randn", 130, 70)):
            shape = (2, 4, max(nq, nk), d)
            if kind == "randn":
                q, k, v = rand(shape, torch.bfloat16)
                do = torch.randn_like(q)
            else:
                q, k, v, do = kind_inputs(kind, "bf16", shape, 3)
            q, do = q[:, :, :nq].contiguous(), do[:, :, :nq].contiguous()
            k, v = k[:, :, :nk].contiguous(), v[:, :, :nk].contiguous()
            for causal in causals:
                o, lse, _ = flash.forward(q, k, v, causal=causal, kernel="triton")
                ref = backward("new", q, k, v, o, lse, do, causal)
                if "atomic" in impls:
                    got = backward("atomic", q, k, v, o, lse, do, causal)
                    rel = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                              for x, y in zip(got, ref, strict=True))
                    print(f"atomic: max |diff| / max |new| {rel:.2e} ({d}, {kind}, {nq}x{nk}, {causal})", flush=True)
                for impl in same:
                    bits.check(backward(impl, q, k, v, o, lse, do, causal), ref, d, kind, nq, nk, causal, impl)
    print(bits.line("'new'"), flush=True)
    rows = []
    print("| d | N | causal | " + " | ".join(impls) + " |  (TFLOP/s, median of paired rounds; ratio to the first)")
    for d, n in shapes:
        for causal in causals:
            row = time_shape(impls, d, n, causal, a.rounds)
            rows.append(row)
            tf = row["tflops"]
            print(f"| {d} | {n} | {causal} | " + " | ".join(f"{tf[i]:.0f} ({tf[i] / tf[impls[0]]:.3f}x)" for i in impls)
                  + " |", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), a.json), "w") as f:
        json.dump({"env": fix_cost.env(), "impls": impls, "bits": bits.record(), "rows": rows}, f)


if __name__ == "__main__":
    main()
