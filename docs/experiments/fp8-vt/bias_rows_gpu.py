"""examples/fp8_fix_bias.py's rows through the FP8 kernel on the GPU, to hold the emulator's numbers there to
the hardware: O of every row and softmax as bits, written to $OUT/fp8_bias_rows.npz.

On the GPU machine:   OUT=$OUT PYTHONPATH=. python docs/experiments/fp8-vt/bias_rows_gpu.py [--rows 2000]
Then here:            PYTHONPATH=. python docs/experiments/fp8-vt/bias_rows_gpu.py --check FILE
(the emulator under the FP8 kernel's policy on the same rows: how many rows match bit for bit, and each
softmax's lean from the GPU's O).
"""

import argparse
import os

import numpy as np

from flashsim import experiments as ex

SOFTMAXES = ("standard", "stabilised", "robust")


def rows(n: int) -> ex.BiasRows:
    return ex.rows_in_format(ex.repeated_maxima_rows(n, seed=1), "e4m3fn")


def run_gpu(n: int) -> None:
    import torch

    from gpu import flash
    from gpu.crosscheck import bits_of
    r = rows(n)
    q, k, v = (torch.from_numpy(x).cuda().to(flash.FP8).unsqueeze(0) for x in (r.q, r.k, r.v))  # (1, rows, N, d)
    out = {sm: bits_of(flash.forward(q, k, v, softmax=sm, sm_scale=1.0)[0])[0] for sm in SOFTMAXES}
    np.savez_compressed(os.path.join(os.environ["OUT"], "fp8_bias_rows.npz"), rows=n, **out)
    print("wrote", {sm: o.shape for sm, o in out.items()})


def check(path: str) -> None:
    import ml_dtypes

    import flashsim as fs
    from gpu.configs import kernel_policy, kernel_variant
    z = np.load(path)
    r = rows(int(z["rows"]))
    pol = kernel_policy("e4m3", r.q.shape[-1], False)
    gold = fs.flash_forward(r.q, r.k, r.v, "fp64", sm_scale=1.0).o
    for sm in SOFTMAXES:
        gpu = z[sm].view(ml_dtypes.bfloat16).astype(np.float64)
        emu = fs.flash_forward(r.q, r.k, r.v, pol, softmax=kernel_variant(sm, "e4m3"), sm_scale=1.0).o
        same = (np.asarray(emu, ml_dtypes.bfloat16).view(np.uint16) == z[sm]).all(axis=(1, 2))
        b = ex.bias((gpu - gold).mean(axis=-1).ravel())
        print(f"{sm:10s} rows bit-identical to the emulator: {same.sum()} of {same.size}; GPU's O: mean error "
              f"{b.mean_error:+.3e} (sign p {b.sign_p:.1e}), mean |error| {b.mean_abs:.2e}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--check", metavar="FILE")
    a = ap.parse_args()
    check(a.check) if a.check else run_gpu(a.rows)
