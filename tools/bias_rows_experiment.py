"""Exploratory (issue 4, not yet the acceptance test): bias of O on many rows with exactly repeated maxima.

    PYTHONPATH=. python tools/bias_rows_experiment.py [--heads 20] [--rows 512] [--seed 5]

Each head has keys 4*e_g plus a bias column, every key direction duplicated (``--group 2``: exact ties) or
not (``--group 1``); query row i points along one direction, and its bias puts the row max r = 16 + b on
a 2**-8 grid in [-1, 1] with every other key 16 below.  V ~ N(-1.5, 0.5) in BF16, sm_scale = 1.  Prints,
per softmax variant, the mean over rows of the row-mean of O - O_fp64 under qiu_yao, with the z-test and
sign-test p-values; ``--pv-fp32`` also runs qiu_yao with P V, O accumulation and rescale kept in FP32.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import emufloat as ef  # noqa: E402
import flashsim as fs  # noqa: E402
from emufloat.trace import mean_test, sign_test  # noqa: E402


def heads(rng: np.random.Generator, n_heads: int, rows: int, group: int, d: int = 64):
    ndir = d - 1
    q = np.zeros((n_heads, rows, d))
    k = np.zeros((n_heads, ndir * group, d))
    v = np.empty((n_heads, ndir * group, d))
    keys = np.repeat(np.arange(ndir), group)
    for h in range(n_heads):
        k[h, np.arange(keys.size), keys] = 4.0
        k[h, :, d - 1] = 1.0
        g = rng.integers(0, ndir, rows)
        q[h, np.arange(rows), g] = 4.0
        q[h, :, d - 1] = np.round(rng.uniform(-17, -15, rows) * 256) / 256
        v[h] = ef.quantize(rng.normal(-1.5, 0.5, (keys.size, d)), "bf16").astype(np.float64)
    return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--pv-fp32", action="store_true")
    args = ap.parse_args()
    pol = fs.get_policy("qiu_yao")
    policies = [pol]
    if args.pv_fp32:
        policies.append(dataclasses.replace(
            pol, name="qiu_yao_pv_fp32", pv=dataclasses.replace(pol.pv, fmt=ef.FP32),
            o_accum=dataclasses.replace(pol.o_accum, fmt=ef.FP32),
            rescale=dataclasses.replace(pol.rescale, fmt=ef.FP32)))
    for group in (2, 1):
        q, k, v = heads(np.random.default_rng(args.seed), args.heads, args.rows, group)
        gold = fs.flash_forward(q, k, v, "fp64", sm_scale=1.0).o
        for p in policies:
            for sm in ("standard", "stabilised", "robust"):
                o = fs.flash_forward(q, k, v, p, softmax=sm, sm_scale=1.0).o
                e = (np.asarray(o, np.float64) - gold).mean(axis=-1).ravel()
                print(f"{'ties' if group == 2 else 'no ties':8s} {p.name:16s} {sm:10s} rows {e.size} "
                      f"mean {e.mean():+.3e}  z p {mean_test(e):.1e}  sign p "
                      f"{sign_test(int((e > 0).sum()), int((e < 0).sum())):.1e}")


if __name__ == "__main__":
    main()
