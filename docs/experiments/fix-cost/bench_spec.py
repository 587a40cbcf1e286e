"""Speculative tie count (spec_overlap.py) against the committed overlap kernel: bits and timing.

cp gpu/kernels/fwd_overlap.py /tmp/spec_overlap.py && patch /tmp/spec_overlap.py docs/experiments/fix-cost/vS.patch
OUT=$OUT PYTHONPATH=.:/tmp python docs/experiments/fix-cost/bench_spec.py
"""
import json
import os
import statistics
import time

import spec_overlap
import torch

import gpu.kernels.fwd_overlap as fo
from gpu import flash
from gpu.run_attention import bench_one, fwd_flops, kind_inputs, rand

T0 = time.time()
ORIG, SPEC = fo.attn_fwd_overlap, spec_overlap.attn_fwd_overlap
SM = ("standard", "stabilised", "robust")
res = {"bits": [], "timing": []}


def run(kern, q, k, v, causal, sm):
    fo.attn_fwd_overlap = kern
    return flash.forward(q, k, v, causal=causal, softmax=sm, kernel="overlap")


same = differ = 0
for kind in ("random", "repeated", "sink", "large"):
    for n in (4096, 3008):
        qkv = kind_inputs(kind, "bf16", (2, 4, n, 128), 11)[:3]
        for causal in (False, True):
            for sm in SM[1:]:
                o1, l1, _ = run(ORIG, *qkv, causal, sm)
                o2, l2, _ = run(SPEC, *qkv, causal, sm)
                ok = torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(
                    l1.view(torch.int32), l2.view(torch.int32))
                same += ok
                differ += not ok
                if not ok:
                    res["bits"].append([kind, n, causal, sm])
print(f"bits: {same} same, {differ} differ  ({time.time() - T0:.0f} s)", flush=True)
res["bits_summary"] = {"same": same, "differ": differ}

B, H, N, D = 4, 32, 4096, 128
inputs = {"randn": rand((B, H, N, D), torch.bfloat16), "repeated": kind_inputs("repeated", "bf16", (B, H, N, D), 3)[:3]}
for name, (q, k, v) in inputs.items():
    for causal in (False, True):
        fl = fwd_flops(B, H, N, D, causal)
        rows = {f"{t}_{sm}": [] for t in ("orig", "spec") for sm in SM}
        for _ in range(5):
            for t, kern in (("orig", ORIG), ("spec", SPEC)):
                for sm in SM:
                    if t == "spec" and sm == "standard":
                        continue
                    rows[f"{t}_{sm}"].append(fl / bench_one(run, kern, q, k, v, causal, sm) / 1e9)
        rows["spec_standard"] = rows["orig_standard"]
        med = {key: statistics.median(val) for key, val in rows.items()}
        std = med["orig_standard"]
        line = {"input": name, "causal": causal, "median": med, "rounds": rows,
                "cost": {key: round(100 * (1 - val / std), 1) for key, val in med.items()}}
        res["timing"].append(line)
        print(name, causal, {k2: round(v2) for k2, v2 in med.items()}, line["cost"], f"({time.time() - T0:.0f} s)",
              flush=True)
        json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "spec.json"), "w"), indent=1)
