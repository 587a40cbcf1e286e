"""Keep a recording of `studies.device.atomic_orders` compactly: per distinct dQ the SHA-256 of its bits and the few
elements where it differs from the emulator's dQ in the policy's own order (the GPU's order cannot be regenerated
from a seed); the other outputs by their SHA-256, as recorded.

    python -m tools.keep_atomic_orders SRC_FOLDER tests/data/atomic_orders
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import gpu.policies  # noqa: F401  (its policy functions, for the recorded launches' policies)
from flashsim.crosscheck import to_bits
from flashsim.recording import Patch, sha256_of
from gpu.crosscheck.kernels import sdpa_policy
from studies.device.atomic_orders import _heads


def model_dq(case: dict) -> np.ndarray:
    """The emulator's dQ bits of a recorded case, the K/V blocks added in the policy's order."""
    import flashsim as fs

    h, n, d, causal, dtype = case["case"]
    x = _heads(h, n, d, dtype, case["seed"])
    pol = sdpa_policy("flash", case["launch"]).resolve()
    f = fs.flash_forward(x["q"], x["k"], x["v"], pol, causal=causal)
    b = fs.flash_backward(x["q"], x["k"], x["v"], f.o, f.lse, x["do"], pol, causal=causal)
    return to_bits(b.dq, pol.dq.out.fmt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.keep_atomic_orders", description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="the device's output folder (atomic_orders.json, atomic_orders.npz)")
    ap.add_argument("dst", type=Path, help="where to keep it")
    args = ap.parse_args(argv)
    meta = json.loads((args.src / "atomic_orders.json").read_text())
    with np.load(args.src / "atomic_orders.npz") as z:
        bits = {key: z[key] for key in z.files}
    for i, case in enumerate(meta["cases"]):
        model = model_dq(case)
        kept = []
        for j, dig in enumerate(case["dq_digests"]):
            dq = bits[f"case{i}/dq{j}"]
            assert sha256_of(dq) == dig, (i, j)
            patch = Patch.between(model, dq)
            kept.append({"sha256": dig, "index": patch.index.tolist(), "bits": patch.bits.tolist()})
            print(case["case"], "dq", j, "differs from the model's order in", len(patch), "elements")
        case["dq"] = kept
        del case["dq_digests"]
    meta["kept_by"] = "python -m tools.keep_atomic_orders SRC tests/data/atomic_orders"
    args.dst.mkdir(parents=True, exist_ok=True)
    (args.dst / "atomic_orders.json").write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
