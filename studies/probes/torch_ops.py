"""Probe 9: the eager torch CUDA ops Qiu & Yao's attention runs between its GEMMs.

    PYTHONPATH=. python -m studies.probes.torch_ops --out $OUT

- `sums`: the order of `torch.sum(dim=-1)` over fp32 rows at the pipeline's shapes ((rows, n): the
  exp-weight row sums of a 512-query tile over 512, 128 and 200 keys), and over bf16 rows under autocast
  (delta's sums of bf16 products over d = 64 and 128).
  FPRev pair rows (`studies.probes.trees`), launched as tensors of exactly that shape, give each shape's
  tree; the tree is then checked against the GPU on random rows of the same shape.
- `exp_log`: `torch.exp` and `torch.log` (fp32) of every bf16 value (the forward's exp and log inputs
  are bf16 values), outputs as bits; and `torch.exp` on 2**22 fp32 inputs of the backward's range,
  compared with `emufloat.hw.libdevice.expf` on this machine's CPU.
- `div`: bf16 / bf16 as `oc.div_(row_sums)` runs it, on 2**22 random pairs, against the fp32 quotient
  rounded to bf16.

Writes `torch_ops.json` (trees, mismatch counts, the torch version and card) and `torch_ops.npz`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from gpu.commands import probe_main

from . import trees

SEED = 20261127
#: (rows, n) of every row sum the pipeline runs at its test lengths (200 and 640 keys, one or two tiles)
SUM_SHAPES = ((512, 512), (512, 128), (200, 200), (512, 64), (200, 64), (200, 128), (128, 64), (8, 512), (1, 200))
#: (rows, n) of delta's sum of bf16 products under autocast (d = 64 and 128; q tiles of 512, 200 and 128 rows)
BF16_SUM_SHAPES = ((512, 64), (512, 128), (200, 64), (200, 128), (128, 64), (128, 128), (8, 128), (512, 256))


def _sums(x: np.ndarray, rows: int, bf16: bool) -> np.ndarray:
    """torch.sum(dim=-1) of `x` launched `rows` rows at a time: fp32, or bf16 summed under CUDA bf16
    autocast (which sums in fp32 and returns fp32, as `(do * o).sum(-1)` runs in the pipeline)."""
    import torch

    out = []
    for i in range(0, len(x), rows):
        t = torch.from_numpy(x[i : i + rows]).cuda()
        if bf16:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                r = t.to(torch.bfloat16).sum(dim=-1)
            if r.dtype != torch.float32:
                raise RuntimeError(f"autocast summed bf16 into {r.dtype}, not float32")
        else:
            r = t.sum(dim=-1)
        out.append(r.cpu().numpy())
    return np.concatenate(out)


def sum_tree(shape: tuple[int, int], rng: np.random.Generator, bf16: bool = False) -> dict:
    """The tree torch.sum(dim=-1) follows on fp32 (or, `bf16`, autocast bf16) tensors of `shape`, and
    its check on random rows."""
    import emufloat as ef

    rows, n = shape
    pairs = trees.all_pairs(n)
    probe = trees.fprev_rows(n, pairs)
    pad = -len(probe) % rows
    probe = np.concatenate([probe, np.ones((pad, n), np.float32)])
    sums = _sums(probe, rows, bf16)[: len(pairs)]
    sizes, bad = trees.lca_sizes_from_sums(sums, n)
    found = trees.infer_tree(n, pairs, sizes)
    check = (rng.standard_normal((64 * rows, n)) * np.exp2(rng.integers(-8, 8, (64 * rows, 1)))).astype(np.float32)
    check = np.abs(check) if n > 128 else check  # exp weights are positive; delta's products are not
    if bf16:
        check = np.asarray(ef.quantize(check, ef.BF16), np.float32)
    gpu = _sums(check, rows, bf16)
    model = trees.eval_tree(found["tree"], check)
    return {
        "shape": list(shape),
        "input": "bf16 under autocast" if bf16 else "fp32",
        "probe_failures": bad,
        "consistent": found["consistent"],
        "lca_mismatch": found["lca_mismatch"],
        "tree": found["tree"],
        "describe": {k: v for k, v in trees.describe(found["tree"]).items() if k != "tree_str"},
        "random_rows": int(len(check)),
        "random_mismatches": int(np.count_nonzero(model.view(np.uint32) != gpu.view(np.uint32))),
    }


def exp_log(rng: np.random.Generator) -> tuple[dict, dict]:
    import torch

    from emufloat.hw import libdevice

    b = np.arange(2**16, dtype=np.uint32) << 16  # every bf16 value, as fp32 bits
    x = torch.from_numpy(b.view(np.float32)).cuda()
    arrays = {"exp_bf16": torch.exp(x).cpu().numpy().view(np.uint32), "log_bf16": torch.log(x).cpu().numpy()}
    arrays["log_bf16"] = arrays["log_bf16"].view(np.uint32)
    y = rng.uniform(-90.0, 1.0, 2**22).astype(np.float32)
    gpu = torch.exp(torch.from_numpy(y).cuda()).cpu().numpy().view(np.uint32)
    with np.errstate(all="ignore"):
        model = np.asarray(libdevice.expf(y), np.float32).view(np.uint32)
        bf = b.view(np.float32)
        exp_all = np.asarray(libdevice.expf(bf), np.float32).view(np.uint32)
        log_all = np.asarray(libdevice.logf(bf), np.float32).view(np.uint32)
    res = {
        "exp_fp32_random": int(y.size),
        "exp_fp32_mismatches": int(np.count_nonzero(model != gpu)),
        "exp_bf16_mismatches_vs_libdevice": int(np.count_nonzero(exp_all != arrays["exp_bf16"])),
        "log_bf16_mismatches_vs_libdevice": int(np.count_nonzero(log_all != arrays["log_bf16"])),
    }
    return res, arrays


def division(rng: np.random.Generator) -> dict:
    import torch

    from emufloat import BF16, quantize

    a = quantize(rng.standard_normal(2**22).astype(np.float32) * 4, BF16)
    b = quantize(rng.uniform(1.0, 600.0, 2**22).astype(np.float32), BF16)
    ta, tb = (torch.from_numpy(np.asarray(t, np.float32)).cuda().to(torch.bfloat16) for t in (a, b))
    gpu = ta.div_(tb).float().cpu().numpy()
    model = quantize(np.float32(a) / np.float32(b), BF16)
    return {"pairs": int(a.size), "mismatches": int(np.count_nonzero(np.float32(model) != gpu))}


def run(out: Path) -> int:
    import torch

    t0 = time.monotonic()
    rng = np.random.default_rng(SEED)
    res: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    res["sums"] = [sum_tree(s, rng) for s in dict.fromkeys(SUM_SHAPES)]
    res["sums"] += [sum_tree(s, rng, bf16=True) for s in BF16_SUM_SHAPES]
    for s in res["sums"]:
        print(
            "sum",
            s["shape"],
            s["input"],
            s["describe"]["root_splits"][:2],
            "runs",
            s["describe"]["sequential_runs"][:3],
        )
        print("    random mismatches", s["random_mismatches"], flush=True)
    res["exp_log"], arrays = exp_log(rng)
    print("exp/log", res["exp_log"], flush=True)
    res["div"] = division(rng)
    print("div", res["div"], flush=True)
    res["seconds"] = round(time.monotonic() - t0, 1)
    np.savez_compressed(out / "torch_ops.npz", **arrays)
    (out / "torch_ops.json").write_text(json.dumps(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(
        "studies.probes.torch_ops",
        "probe torch's CUDA sum, exp, log and division",
        "torch_ops.json and .npz",
        run,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
