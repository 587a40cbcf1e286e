"""The split-softmax overlap kernel (split_softmax.patch) against the committed kernels, in one process.

On the GPU machine, from the repository root at commit ea23731:

    mkdir -p /tmp/base && touch /tmp/base/__init__.py
    git show ea23731:gpu/kernels/fwd.py | sed 's/^from .interpreter/from gpu.kernels.interpreter/' \
        > /tmp/base/old_fwd.py
    git show ea23731:gpu/kernels/fwd_overlap.py | sed 's/^from .fwd import/from base.old_fwd import/' \
        > /tmp/base/old_overlap.py
    git apply docs/experiments/fix-cost/split_softmax.patch
    OUT=$OUT PYTHONPATH=.:/tmp python docs/experiments/fix-cost/bench_split.py

Warms Triton's cache from 15 processes, checks that the patched overlap kernel and the committed overlap and tl
kernels give the patched tl kernel's bits (O and LSE) on adversarial inputs, then times all four with
benchmarks/fix_cost.py's paired rounds (two passes) and writes $OUT/split_softmax.json (results.json
``fix_cost_investigation.runs.split_softmax``).  The recorded run (2026-11-25) ran this logic from an
untracked copy (the committed kernels as scratch.old_*, bits compared with torch.equal).
"""

import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

SHAPES = [(128, 4096), (128, 16384), (64, 4096)]
_OLD: dict = {}
_NEW: tuple = ()


def use(which: str) -> None:
    """Route flash's overlap and tl launches to the committed ('old') or the patched ('new') kernels."""
    from gpu import flash
    from gpu.launch import Launcher
    if which == "old":
        from base.old_fwd import attn_fwd
        from base.old_overlap import attn_fwd_overlap
        flash._overlap_launcher = lambda: _OLD.setdefault(0, Launcher(attn_fwd_overlap))
        flash._FWD = _OLD.setdefault(1, Launcher(attn_fwd))
    else:
        flash._overlap_launcher, flash._FWD = _NEW


def warm(args) -> str:
    global _NEW
    d, causal, which, n = args
    import torch

    from gpu import flash
    _NEW = (flash._overlap_launcher, flash._FWD)
    use(which)
    q = torch.randn((1, 1, n, d), device="cuda", dtype=torch.bfloat16)
    for sm in flash.SOFTMAX_IDS:
        for kernel in ("overlap", "triton"):
            flash.forward(q, q, q, causal=causal, softmax=sm, kernel=kernel)
    torch.cuda.synchronize()
    return f"{args} compiled"


def main() -> None:
    global _NEW
    t0 = time.time()
    jobs = [(d, c, w, n) for d in (64, 128) for c in (False, True) for w in ("old", "new") for n in (4096, 1000)]
    with mp.get_context("spawn").Pool(15) as pool:
        for line in pool.imap_unordered(warm, jobs):
            print(line, f"{time.time() - t0:.0f}s", flush=True)
    import fix_cost
    import torch

    from gpu import flash
    from gpu.crosscheck import bits_of
    from gpu.run_attention import kind_inputs, rand
    _NEW = (flash._overlap_launcher, flash._FWD)
    bad = total = 0
    for d in (64, 128):
        for kind, n in (("randn", 4096), ("repeated", 4096), ("repeated", 1000), ("large", 1000), ("sink", 1000)):
            shape = (2, 4, n, d)
            q, k, v = rand(shape, torch.bfloat16) if kind == "randn" else kind_inputs(kind, "bf16", shape, 3)[:3]
            for causal in (False, True):
                for sm in flash.SOFTMAX_IDS:
                    ref = flash.forward(q, k, v, causal=causal, softmax=sm, kernel="triton")
                    for which, kernel in (("new", "overlap"), ("old", "overlap"), ("old", "triton")):
                        use(which)
                        got = flash.forward(q, k, v, causal=causal, softmax=sm, kernel=kernel)
                        use("new")
                        total += 1
                        if not all((bits_of(a) == bits_of(b)).all() for a, b in zip(got[:2], ref[:2], strict=True)):
                            bad += 1
                            print("DIFFERENT", d, kind, n, causal, sm, which, kernel, flush=True)
    print(f"bits: {total - bad} of {total} runs identical to the patched tl kernel", flush=True)
    rows = []
    print("| d | N | causal | kernel | standard | stabilised | robust | stab cost | robust cost |")
    for d, n in SHAPES:
        q, k, v = rand((4, 32, n, d), torch.bfloat16)
        for causal in (False, True):
            for rnd in range(2):
                for which in ("new", "old", "triton", "triton-old"):
                    use("old" if which.endswith("old") else "new")
                    m = fix_cost.measure(q, k, v, causal, "triton" if which.startswith("triton") else "overlap", 10)
                    use("new")
                    row = dict(d=d, n=n, causal=causal, kernel=which, pass_=rnd, **m,
                               **fix_cost.summarise(m["ms"], fix_cost.fwd_flops(4, 32, n, d, causal)))
                    rows.append(row)
                    t = row["tflops"]
                    print(f"| {d} | {n} | {causal} | {which} | {t['standard']:.0f} | {t['stabilised']:.0f} | "
                          f"{t['robust']:.0f} | {row['stabilised_cost']['median']:+.1f}% | "
                          f"{row['robust_cost']['median']:+.1f}% |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "split_softmax.json"), "w") as f:
        json.dump({"env": fix_cost.env(), "rows": rows}, f)


if __name__ == "__main__":
    main()
