"""Is the backward slower after the robust forward? bench_gpu showed, in three runs (2026-11-24, -25, -26),
the backward at d=128, N=4096 without causal masking 11-13% slower for the robust softmax than for the other
two, although ``flash.backward`` takes no softmax.  This times, by paired rounds (softmaxes back to back,
order rotated, CUDA events), (a) ``flash.backward`` on each softmax's (O, LSE), (b) the same on fresh copies
of them, and (c) the autograd path bench_gpu times (``o.backward(do, retain_graph=True)``).

    PYTHONPATH=. python docs/experiments/bwd-gap/bwd_gap.py [--n 4096] [--d 128] [--rounds 20]

Rounds as in benchmarks/fix_cost.py (``paired_rounds``).  The run recorded in results.json ``bwd_gap`` used an
inline copy of that timer which synchronised after each timed call; same pairing, same events.
"""

import argparse
import statistics
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

import torch  # noqa: E402
from fix_cost import paired_rounds  # noqa: E402

from gpu import flash  # noqa: E402
from gpu.run_attention import fwd_flops, rand  # noqa: E402

SMS = ("standard", "stabilised", "robust")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    B, H = 4, 32
    q, k, v = rand((B, H, a.n, a.d), torch.bfloat16)
    do = torch.randn_like(q)
    flops = 2.5 * fwd_flops(B, H, a.n, a.d, False)
    fw = {sm: flash.forward(q, k, v, softmax=sm)[:2] for sm in SMS}
    calls = {f"own {sm}": (lambda o=o, lse=lse: flash.backward(q, k, v, o, lse, do)) for sm, (o, lse) in fw.items()}
    copies = {sm: (o.clone(), lse.clone()) for sm, (o, lse) in fw.items()}
    calls.update({f"copy {sm}": (lambda o=o, lse=lse: flash.backward(q, k, v, o, lse, do))
                  for sm, (o, lse) in copies.items()})
    for sm in SMS:
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        o = flash.attention(qq, kk, vv, softmax=sm)
        calls[f"autograd {sm}"] = (lambda o=o: o.backward(do, retain_graph=True))
    reps = 5
    for fn in calls.values():  # compile, warm up
        fn()
    runs = {key: (lambda fn=fn: [fn() for _ in range(reps)]) for key, fn in calls.items()}
    res = {key: statistics.median(ms) for key, ms in paired_rounds(runs, a.rounds, reps).items()}
    for sm in SMS:
        o, lse = fw[sm]
        diff = (o.float() - fw["standard"][0].float()).abs().max().item()
        print(f"{sm}: max |O - O_standard| {diff:.3g}, LSE range {lse.min().item():.3f} .. {lse.max().item():.3f}")
    print(f"| call | ms | TFLOP/s |  (B={B} H={H} N={a.n} d={a.d}, non-causal, {a.rounds} paired rounds)")
    for key, t in res.items():
        print(f"| {key} | {t:.3f} | {flops / t / 1e9:.0f} |")


if __name__ == "__main__":
    main()
