"""Probe 10: crafted inputs that isolate cuDNN's softmax steps (its SDPA backend is closed source).

    PYTHONPATH=. python -m studies.probes.cudnn_steps --out $OUT

Every case is one head, d = 64, q_i = a_i e_0 (a_i a bf16 value per row), so row i scores key j as a_i c_j
with c_j = k_j[0]; V is random.  Families (`cases`):

- `equal`: every c_j = 1, so every score of a row is the row max, every P is exactly 1 and l = n_k in
  any order.  The LSE then shows only its own formula (m, the scale, the log), over n_k from 1 to 1000.
- `one_max`: c_t = 1 for one key t and c_j = 0 for the others, so P is 1 at t and ex2(-m') elsewhere,
  the same value n_k - 1 times: l's rounding shows the order of the row sum, over n_k and t.

The same inputs run through SDPA's flash backend, whose model is exact, as a control of the probe.  Writes
`cudnn_steps.json` (cases, versions) and `cudnn_steps.npz` (O and LSE bits per backend and case).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from gpu.commands import probe_main

SEED = 20261129
D = 64
ROWS = 128
EQUAL_LENGTHS = (1, 2, 3, 64, 100, 128, 129, 200, 256, 1000)
ONE_MAX = ((64, 0), (64, 63), (128, 0), (128, 77), (128, 127), (200, 130), (256, 0), (256, 255), (512, 300))


def _row_values(rng: np.random.Generator, dtype: str) -> np.ndarray:
    """a_i: bf16/fp16 values from 2**-6 to 2**7 in magnitude, both signs, and 0."""
    import emufloat as ef

    a = rng.uniform(1.0, 2.0, ROWS) * np.exp2(rng.integers(-6, 8, ROWS)) * rng.choice([-1.0, 1.0], ROWS)
    a[0] = 0.0
    return np.asarray(ef.quantize(a.astype(np.float32), ef.as_format(dtype)), np.float32)


def cases(dtype: str) -> list[dict]:
    """The probe's cases for `dtype` ('bf16' or 'fp16'): name, q, k, v as float32 arrays of dtype values."""
    import emufloat as ef

    rng = np.random.default_rng(SEED + (dtype == "fp16"))
    out = []
    for family, shapes in (("equal", [(n, None) for n in EQUAL_LENGTHS]), ("one_max", ONE_MAX)):
        for n_k, t in shapes:
            q = np.zeros((ROWS, D), np.float32)
            q[:, 0] = _row_values(rng, dtype)
            k = np.zeros((n_k, D), np.float32)
            k[:, 0] = 1.0 if t is None else 0.0
            if t is not None:
                k[t, 0] = 1.0
            v = np.asarray(ef.quantize(rng.standard_normal((n_k, D)).astype(np.float32), ef.as_format(dtype)))
            name = f"{dtype}_{family}_n{n_k}" + ("" if t is None else f"_t{t}")
            out.append({"name": name, "q": q, "k": k, "v": np.asarray(v, np.float32)})
    return out


def run(out: Path) -> int:
    import torch

    from gpu.crosscheck.kernels import sdpa
    from gpu.crosscheck.live import bits_of

    t0 = time.monotonic()
    arrays, meta = {}, {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "cases": []}
    meta["device"] = torch.cuda.get_device_name()
    scale = 1.0 / np.sqrt(D)
    for dtype, tdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for case in cases(dtype):
            q, k, v = (torch.from_numpy(case[n]).cuda().to(tdt)[None, None] for n in "qkv")
            meta["cases"].append(case["name"])
            for backend in ("cudnn", "flash"):
                try:
                    o, lse = sdpa(backend)(q, k, v, False, scale)
                    arrays[f"{backend}/{case['name']}/o"] = bits_of(o[0, 0])
                    arrays[f"{backend}/{case['name']}/lse"] = bits_of(lse[0, 0])
                except Exception as exc:  # noqa: BLE001 - a backend refusing a shape is a result
                    meta.setdefault("errors", {})[f"{backend}/{case['name']}"] = f"{type(exc).__name__}: {exc}"[:300]
    meta["seconds"] = round(time.monotonic() - t0, 1)
    np.savez_compressed(out / "cudnn_steps.npz", **arrays)
    (out / "cudnn_steps.json").write_text(json.dumps(meta, indent=1))
    print(f"cudnn_steps: {len(meta['cases'])} cases, {len(meta.get('errors', {}))} errors, {meta['seconds']} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(
        "studies.probes.cudnn_steps", "probe cuDNN's softmax steps", "cudnn_steps.json and .npz", run, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
