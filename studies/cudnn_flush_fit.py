"""Which of cuDNN's forward steps flush subnormal results, fitted to the GPU's bits: every subset of the FP32 steps
of `gpu.policies.sdpa_cudnn_policy` flushed (`FP32_FTZ`) or not (`FP32`), each scored by the share of O and LSE
elements it reproduces on recorded launches.

    python -m studies.cudnn_flush_fit fresh_check.json --bits fresh_bits_0.npz [...] [--max-keys 1100]
        [--search single|all]

The recording is a `studies.device.fresh_check` run of the cuDNN kernel with its bits kept (``--keep-bits
sdpa_cudnn``), on inputs where flushing shows (``--kinds subnormal --dtype bf16``: `studies/device/run_open_checks.sh`
makes one).  The policy infers that every step flushes; where the GPU says otherwise, this names the steps.  With
``--search single`` (the default) the variants are: all steps flushed, none, and each step alone changed from
all-flushed (2 + 7); ``all`` tries the 128 subsets.  Prints one line a variant, best first: O and LSE elements
identical, and the launches identical in both.  Exit status 0 whether or not a variant reproduces every launch.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command
from gpu.policies.sdpa_cudnn import FORWARD_ALU_STEPS, flushing

#: the forward's FP32 steps a compiled kernel can flush, as the fields of a Policy
STEPS = FORWARD_ALU_STEPS


def variant(policy, flushed: frozenset[str]):
    """``policy`` with the forward steps in ``flushed`` in FP32_FTZ and the other `STEPS` in FP32, named so."""
    name = "ftz_" + ("_".join(s for s in STEPS if s in flushed) or "none")
    return dataclasses.replace(flushing(policy, flushed), name=f"{policy.name}_{name}")


def variants(search: str) -> list[frozenset[str]]:
    """The subsets of `STEPS` flushed that ``search`` tries ('single' or 'all')."""
    every = frozenset(STEPS)
    if search == "all":
        return [frozenset(c) for r in range(len(STEPS) + 1) for c in itertools.combinations(STEPS, r)]
    return [every, frozenset(), *(every - {s} for s in STEPS)]


def forward_bits(case: dict, policy) -> dict[str, np.ndarray]:
    """O and LSE bits of a recorded case under ``policy``, from the case's seed."""
    from flashsim.crosscheck import emulate
    from studies.device.fresh_check import case_run

    run = case_run(case)
    run = dataclasses.replace(
        run, policy=policy, do=None, outputs={k: v for k, v in run.outputs.items() if k in ("o", "lse")}
    )
    return emulate(run)


def score(cases: list[dict], gpu: list[dict[str, np.ndarray]], flushed: frozenset[str]) -> dict:
    """Identical O and LSE elements, and launches identical in both, under the variant flushing ``flushed``."""
    from gpu.policies import sdpa_cudnn_policy

    same = {"o": 0, "lse": 0}
    total = {"o": 0, "lse": 0}
    whole = 0
    for case, bits in zip(cases, gpu, strict=True):
        emu = forward_bits(case, variant(sdpa_cudnn_policy(case["dtype"], case["d"]), flushed))
        ok = True
        for k in ("o", "lse"):
            want = bits[k].reshape(emu[k].shape)
            eq = emu[k] == want
            same[k] += int(eq.sum())
            total[k] += eq.size
            ok &= bool(eq.all())
        whole += ok
    return {"flushed": sorted(flushed, key=STEPS.index), "same": same, "total": total, "launches": whole}


def fit(cases: list[dict], gpu: list[dict[str, np.ndarray]], search: str = "single") -> list[dict]:
    """Every variant of ``search`` scored on the cases, best first (launches, then elements)."""
    scored = [score(cases, gpu, f) for f in variants(search)]
    return sorted(scored, key=lambda r: (-r["launches"], -(r["same"]["o"] + r["same"]["lse"])))


def recorded(path: Path, bits_paths: list[Path], max_keys: int) -> tuple[list[dict], list[dict[str, np.ndarray]]]:
    """The cuDNN cases of a fresh_check recording whose O and LSE bits were kept, up to ``max_keys`` keys."""
    from studies.device.fresh_verify import load_bits, load_recording

    rec = load_recording(path)
    bits = load_bits(bits_paths)
    cases, gpu = [], []
    for c in rec["cases"]:
        if c["kernel"] != "sdpa_cudnn" or "digests" not in c or c["n"] > max_keys:
            continue
        keys = {k: f"sdpa_cudnn/{c['seed']}/{k}" for k in ("o", "lse")}
        if all(key in bits for key in keys.values()):
            cases.append(c)
            gpu.append({k: bits[key] for k, key in keys.items()})
    if not cases:
        raise UsageError(
            f"recording: no cuDNN case of {path} up to {max_keys} keys has its O and LSE bits in --bits "
            "(record with fresh_check --keep-bits sdpa_cudnn)"
        )
    return cases, gpu


def run(args) -> int:
    if args.max_keys < 1:
        raise UsageError(f"--max-keys: expected a positive integer, got {args.max_keys}")
    cases, gpu = recorded(Path(args.recording), [Path(p) for p in args.bits], args.max_keys)
    print(f"cudnn_flush_fit: {len(cases)} cuDNN launches, {args.search} search over {', '.join(STEPS)}")
    print("| steps flushed | O identical | LSE identical | launches identical |")
    print("|---|---:|---:|---:|")
    for r in fit(cases, gpu, args.search):
        o, lse = (f"{r['same'][k]} / {r['total'][k]}" for k in ("o", "lse"))
        print(f"| {', '.join(r['flushed']) or 'none'} | {o} | {lse} | {r['launches']} / {len(cases)} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.cudnn_flush_fit", description=__doc__.split("\n")[0])
    ap.add_argument("recording", help="a fresh_check.json with cuDNN launches")
    ap.add_argument("--bits", nargs="+", default=[], help="its fresh_bits_<i>.npz files")
    ap.add_argument("--max-keys", type=int, default=1100, help="launches of at most this many keys (default 1100)")
    ap.add_argument("--search", choices=("single", "all"), default="single", help="the variants tried (default single)")
    args = ap.parse_args(argv)
    return run_command("cudnn_flush_fit", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
