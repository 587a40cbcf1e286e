"""The forward kernels of this tree against those of a base commit, in one process: bits, then paired fix costs.

On the GPU machine, from the repository root, with the base's kernels saved beside the tree (BASE a commit):

    mkdir -p /tmp/base && touch /tmp/base/__init__.py
    git show BASE:gpu/kernels/fwd.py | sed 's/^from .interpreter/from gpu.kernels.interpreter/' \
        > /tmp/base/old_fwd.py
    git show BASE:gpu/kernels/fwd_overlap.py | sed 's/^from .fwd import/from base.old_fwd import/' \
        > /tmp/base/old_overlap.py
    OUT=$OUT PYTHONPATH=.:/tmp python docs/experiments/fix-cost/bench_vs_base.py [--shapes 128x4096,...]
        [--causal no,yes] [--passes 2] [--json NAME]

Warms Triton's cache from 15 processes, checks that this tree's overlap kernel and the base's overlap and tl
kernels give this tree's tl kernel's bits (O and LSE) on adversarial inputs, then times all four ('new',
'old', 'triton', 'triton-old') with benchmarks/fix_cost.py's paired rounds and writes $OUT/NAME.

Recorded runs (results.json ``fix_cost_investigation.runs``), from untracked copies of this logic (the base
kernels as scratch.old_*, bits compared with torch.equal):

- ``split_softmax``: BASE = ea23731 with `git apply docs/experiments/fix-cost/split_softmax.patch`; defaults.
- ``dead_diag``: BASE = c654a69, the tree at f7fbb43; ``--shapes 64x4096,64x16384,128x4096 --causal no
  --passes 3 --json dead_diag.json`` (the bit check on d=64/128 without causal masking, N=4096 randn and
  N=1000 repeated, large and sink).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

import experiment_runs  # noqa: E402

_OLD: dict = {}
_NEW: tuple = ()


def use(which: str) -> None:
    """Route flash's overlap and tl launches to the base commit's ('old') or this tree's ('new') kernels."""
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


def main(argv: list[str] | None = None) -> None:
    global _NEW
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="128x4096,128x16384,64x4096", help="d x N, comma-separated")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json", default="split_softmax.json", help="file name under $OUT")
    a = ap.parse_args(argv)
    shapes, causals = experiment_runs.shapes(a.shapes), experiment_runs.maskings(a.causal)
    experiment_runs.compile_in_pool(warm, [(d, c, w, n) for d in (64, 128) for c in causals for w in ("old", "new")
                                           for n in (4096, 1000)])
    import fix_cost
    import torch

    from gpu import flash
    from gpu.run_attention import kind_inputs, rand
    _NEW = (flash._overlap_launcher, flash._FWD)
    bits = experiment_runs.BitTally()
    for d in (64, 128):
        for kind, n in (("randn", 4096), ("repeated", 4096), ("repeated", 1000), ("large", 1000), ("sink", 1000)):
            shape = (2, 4, n, d)
            q, k, v = rand(shape, torch.bfloat16) if kind == "randn" else kind_inputs(kind, "bf16", shape, 3)[:3]
            for causal in causals:
                for sm in flash.SOFTMAX_IDS:
                    ref = flash.forward(q, k, v, causal=causal, softmax=sm, kernel="triton")
                    for which, kernel in (("new", "overlap"), ("old", "overlap"), ("old", "triton")):
                        use(which)
                        got = flash.forward(q, k, v, causal=causal, softmax=sm, kernel=kernel)
                        use("new")
                        bits.check(got[:2], ref[:2], d, kind, n, causal, sm, which, kernel)
    print(bits.line("this tree's tl kernel"), flush=True)
    rows = []
    print("| d | N | causal | kernel | standard | stabilised | robust | stab cost | robust cost |")
    for d, n in shapes:
        q, k, v = rand((4, 32, n, d), torch.bfloat16)
        for causal in causals:
            for rnd in range(a.passes):
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
    with open(os.path.join(os.environ.get("OUT", "/tmp"), a.json), "w") as f:
        json.dump({"env": fix_cost.env(), "rows": rows}, f)


if __name__ == "__main__":
    main()
