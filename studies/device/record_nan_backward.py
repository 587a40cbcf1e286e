"""Record a backward case whose rows are NaN: the stabilised fix's l = 0 rows, through forward and backward.

Selected query rows are `Q_ROW_VALUE` times the first unit vector and every key's first component is 1, so
those rows score every key alike: each K/V block holds repeated maxima, the paper's fix shifts the max to
2 r with r far above the exp's range, every P underflows, l = 0, O = 0/0 (NaN) and LSE = -inf.  The
backward carries the NaN into delta and dS (so all of dK and the NaN rows of dQ) and the infinite P of those
rows into dV.  The other rows are N(0, 1) draws.  `gpu.crosscheck.cases.nan_rows_inputs` builds the inputs (numpy
only);
`main` runs our kernels' forward and backward on the GPU and writes one
`flashsim.crosscheck.save_run` file per dtype; tests/gpu/test_nan_backward.py checks the kept copy
(gpu/data/runs/nan_backward.json, `python -m tools.keep_recording nan-backward $OUT`) against the emulator.

    PYTHONPATH=. python -m studies.device.record_nan_backward --out $OUT    # on a GPU machine
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import emufloat as ef
from flashsim.console import ArgumentParser, run_command, writable_dir
from gpu.commands import require_gpu, sections
from gpu.configs import kernel_format
from gpu.crosscheck.cases import NAN_ROWS, nan_rows_inputs


def record(dtype: str, note: str):
    """Our kernels' forward and backward on `nan_rows_inputs` (softmax 'stabilised', not causal), as a
    `flashsim.crosscheck.KernelRun` (needs torch, Triton and a GPU)."""
    from gpu.crosscheck.live import live_run

    x = nan_rows_inputs(dtype)
    return live_run(x["q"], x["k"], x["v"], x["do"], dtype=dtype, softmax="stabilised", debug=False, note=note)


def nan_encodings(bits: np.ndarray, dtype: str) -> list[str]:
    """The distinct encodings of the NaNs among an output's bits (uint16 of `dtype` or uint32 of float32)."""
    nan = np.isnan(output_values(bits, dtype))
    return [f"{int(b):#0{2 + 2 * bits.dtype.itemsize}x}" for b in np.unique(bits[nan])]


def output_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of output bits (uint16 of `dtype` or uint32 of float32)."""
    if bits.dtype == np.uint32:
        return bits.view(np.float32)
    return ef.decode(bits.astype(np.uint64), kernel_format(dtype)).astype(np.float32)


def run(args: argparse.Namespace) -> int:
    dtypes = sections(args.dtypes, ("bf16", "fp16"), "--dtypes")
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.record_nan_backward")
    import torch
    import triton

    from flashsim.crosscheck import save_run

    where = (
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, Triton {triton.__version__}; "
        f"PYTHONPATH=. python -m studies.device.record_nan_backward --out $OUT"
    )
    for dtype in dtypes:
        run_ = record(dtype, f"nan_backward_{dtype}: {where}")
        path = save_run(out / f"nan_backward_{dtype}.npz", run_)
        print(f"{path.name}: {run_.note}")
        for name, bits in run_.outputs.items():
            nans = int(np.isnan(output_values(bits, dtype)).sum())
            print(f"  {name:>5}: {nans} NaNs of {bits.size}, encoded {nan_encodings(bits, dtype)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.record_nan_backward", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for nan_backward_<dtype>.npz (created if missing)")
    ap.add_argument("--dtypes", default="bf16,fp16", help="comma-separated, of bf16 and fp16 (default both)")
    args = ap.parse_args(argv)
    return run_command("python -m studies.device.record_nan_backward", lambda: run(args))


__all__ = ["NAN_ROWS", "main", "nan_encodings", "nan_rows_inputs", "output_values", "record"]


if __name__ == "__main__":
    sys.exit(main())
