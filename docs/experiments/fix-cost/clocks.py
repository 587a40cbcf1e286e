"""Is the fixes' cost in the overlap kernel a matter of clocks?  SM clock, power and throttle reasons while
each softmax runs, against its speed.

Each (kernel, softmax) runs as back-to-back CUDA-graph replays for ``--seconds`` per phase, phases rotated
over ``--passes``; ``nvidia-smi`` samples the GPU every 50 ms in the background.  Per phase: TFLOP/s, median
SM clock and power of the samples inside it (the first 0.5 s dropped), the share of samples with the
software power cap active, and cycles per forward (time x clock): if the fixes cost time but not cycles,
the clock, not the schedule, is what they cost.  On the GPU machine:

    OUT=$OUT PYTHONPATH=. python docs/experiments/fix-cost/clocks.py [--d 128] [--n 4096] [--seconds 4]
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, ".")

import torch  # noqa: E402

from gpu import flash  # noqa: E402
from gpu.run_attention import cuda_graph, env, fwd_flops, rand  # noqa: E402

FIELDS = "timestamp,clocks.sm,power.draw,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown," \
         "temperature.gpu"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--kernels", default="overlap,triton")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json", default="clocks.json")
    a = ap.parse_args()
    b, h = 4, 32
    q, k, v = rand((b, h, a.n, a.d), torch.bfloat16)
    flops = fwd_flops(b, h, a.n, a.d, a.causal)
    graphs = {}
    for kernel in a.kernels.split(","):
        for sm in flash.SOFTMAX_IDS:
            def call(kernel=kernel, sm=sm):
                flash.forward(q, k, v, causal=a.causal, softmax=sm, kernel=kernel)
            graphs[(kernel, sm)] = cuda_graph(call, 16)
    torch.cuda.synchronize()
    log = os.path.join(os.environ.get("OUT", "/tmp"), "smi.csv")
    fields = FIELDS
    if subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True).returncode:
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")  # older drivers' name
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "50",
                            "-f", log])
    time.sleep(1.0)
    phases = []
    keys = list(graphs)
    for p in range(a.passes):
        for i in range(len(keys)):
            key = keys[(i + p) % len(keys)]
            g = graphs[key]
            g.replay()
            torch.cuda.synchronize()
            t0 = time.time()
            reps = 0
            while time.time() - t0 < a.seconds:
                for _ in range(4):
                    g.replay()
                torch.cuda.synchronize()
                reps += 4 * 16
            t1 = time.time()
            phases.append(dict(kernel=key[0], softmax=key[1], pass_=p, start=t0, end=t1, forwards=reps,
                               tflops=flops * reps / (t1 - t0) / 1e12))
    time.sleep(0.5)
    smi.terminate()
    smi.wait()
    samples = []
    with open(log) as f:
        for row in csv.reader(f):
            ts = time.mktime(time.strptime(row[0].strip().split(".")[0], "%Y/%m/%d %H:%M:%S")) + \
                float("0." + row[0].strip().split(".")[1])
            samples.append((ts, float(row[1]), float(row[2]), row[3].strip() == "Active", row[4].strip() == "Active",
                            float(row[5])))
    print("| kernel | softmax | pass | TFLOP/s | SM MHz | W | power cap | HW slowdown | degC | Mcycles / forward |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ph in phases:
        inside = [s for s in samples if ph["start"] + 0.5 <= s[0] <= ph["end"]]
        if not inside:
            continue
        mhz = statistics.median(s[1] for s in inside)
        ph.update(mhz=mhz, watts=statistics.median(s[2] for s in inside),
                  power_cap=sum(s[3] for s in inside) / len(inside),
                  hw_slowdown=sum(s[4] for s in inside) / len(inside),
                  temp=statistics.median(s[5] for s in inside), samples=len(inside),
                  mcycles=mhz * (ph["end"] - ph["start"]) / ph["forwards"])
        print(f"| {ph['kernel']} | {ph['softmax']} | {ph['pass_']} | {ph['tflops']:.0f} | {mhz:.0f} | "
              f"{ph['watts']:.0f} | {ph['power_cap']:.0%} | {ph['hw_slowdown']:.0%} | {ph['temp']:.0f} | "
              f"{ph['mcycles']:.3f} |", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), a.json), "w") as f:
        json.dump({"env": env(), "args": vars(a), "phases": phases}, f, indent=1)


if __name__ == "__main__":
    main()
