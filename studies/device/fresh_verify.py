"""The cases of a `fresh_check` recording that the device did not check, checked here from their seeds: every
output the policy gives is compared with the GPU's by its SHA-256; outputs summed by atomic adds, whose bits the
recording kept (fresh_bits_<i>.npz), are checked against every order of their adds, as on the device.

    python -m studies.device.fresh_verify fresh_check.json [--bits fresh_bits_0.npz ...] [--jobs 2] [--out F]
        [--again] [--launch-policy] [--kernels K,...]

Writes the recording again (to --out, by default over itself) with each case checked here given a `check` like
the device's (`where: "cpu"`); an output whose digest differs and whose bits were not kept is said as such
(`unjudged`), never counted identical.  Progress is written after every case: a run cut short loses nothing.  With
``--launch-policy`` each case's policy is derived from its recorded launch again (a kernel whose policy learnt to
read more of the launch: Qiu & Yao's pipeline from the GEMMs cuBLAS ran) and the cases it changes are checked.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command
from flashsim.recording import sha256_of
from studies.device.fresh_check import case_run, emulated_outputs, register_checkout_policies, summary


def verify(case: dict, kept: dict[str, np.ndarray]) -> dict:
    """The check of one recorded case: ``kept`` the GPU's bits of some of its outputs (by output name)."""
    from flashsim.crosscheck import crosscheck

    register_checkout_policies()
    t0 = time.monotonic()
    try:
        emu = emulated_outputs(case)
    except Exception as exc:  # noqa: BLE001 - a launch the policy cannot model is a result
        return {"error": f"{type(exc).__name__}: {exc}"[:1000], "where": "cpu"}
    outputs, unjudged = {}, []
    for k, digest in case["digests"].items():
        if sha256_of(emu[k]) == digest:
            outputs[k] = emu[k]  # the same SHA-256: the GPU's bits
        elif k in kept:
            outputs[k] = kept[k].reshape(emu[k].shape)
        else:
            unjudged.append(k)
    if unjudged:  # no bits to compare: said, not guessed
        identical = {k: 1.0 for k in outputs if k not in kept}
        return {"identical": identical, "unjudged": unjudged, "up_to_atomic_order": False, "where": "cpu"}
    rep = crosscheck(case_run(case, outputs), emulated=emu)
    return summary(rep) | {"seconds": round(time.monotonic() - t0, 1), "where": "cpu"}


def launch_policy(case: dict) -> dict | None:
    """The policy the case's kernel derives from its launch now (its ``policy_for``), as the recording keeps a
    policy; None where this module has no derivation for the kernel (the recorded one stands)."""
    from gpu.crosscheck.kernels import sdpa
    from gpu.policies.qiu_yao import qiu_yao_policy_for

    if "launch" not in case:
        return None
    if case["kernel"] == "paper":
        return qiu_yao_policy_for(case["launch"]).to_json()
    if case["kernel"] == "fa4":
        from gpu.crosscheck.flash_attn4 import fa4

        return fa4().policy_for(case["launch"]).to_json()
    if case["kernel"].startswith("sdpa_"):
        ref = sdpa(case["kernel"].removeprefix("sdpa_")).policy_for(case["launch"])
        return None if ref is None else ref.to_json()
    return None


def _verdict(check: dict) -> str:
    if check.get("up_to_atomic_order"):
        return "identical"
    if check.get("unjudged"):
        return f"unjudged ({', '.join(check['unjudged'])}: digest differs, no bits kept)"
    return "ERROR" if "error" in check else "DIFFERS"


def load_recording(path: Path) -> dict:
    """A fresh_check recording, read and checked: a UsageError saying what it is not."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"recording: cannot read a fresh_check recording from {path}: {exc}") from None
    cases = rec.get("cases") if isinstance(rec, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "kernel" in c for c in cases):
        raise UsageError(f"recording: {path} is not a fresh_check recording (an object whose 'cases' list each case)")
    return rec


def load_bits(paths: list[Path]) -> dict[str, np.ndarray]:
    """The outputs' bits a recording kept (fresh_bits_<i>.npz), by key; a UsageError naming a missing file."""
    for p in paths:
        if not Path(p).is_file():
            raise UsageError(f"--bits: no such file: {p}")
    bits: dict[str, np.ndarray] = {}
    for p in paths:
        with np.load(p, allow_pickle=False) as z:
            bits.update({k: z[k] for k in z.files})
    return bits


def _todo(cases: list[dict], kernels: list[str] | None, again: bool) -> list[int]:
    return [
        i
        for i, c in enumerate(cases)
        if "digests" in c
        and (kernels is None or c["kernel"] in kernels)
        and (again or "identical" not in c.get("check", {}) or c["check"].get("unjudged"))
    ]


def run(args) -> int:
    path = Path(args.recording)
    rec = load_recording(path)
    cases = rec["cases"]
    kernels = args.kernels.split(",") if args.kernels else None
    bits = load_bits([Path(p) for p in args.bits])
    out = Path(args.out) if args.out else path
    todo = _todo(cases, kernels, args.again)
    if args.launch_policy:  # the cases whose launch now gives another policy than the one they were checked under
        rederived = set()
        for i, c in enumerate(cases):
            new = launch_policy(c) if "digests" in c and (kernels is None or c["kernel"] in kernels) else None
            if new is not None and new != c.get("policy"):
                c["policy"] = new
                rederived.add(i)
        todo = sorted(rederived | (set(todo) if args.again else set()))
    todo.sort(key=lambda i: cases[i]["heads"] * cases[i]["n"] ** 2 * cases[i]["d"])  # the quick ones first
    print(f"fresh_verify: {len(todo)} cases to check, {len(bits)} outputs' bits kept", flush=True)
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    t0 = time.monotonic()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {}
        for i in todo:
            c = cases[i]
            prefix = f"{c['kernel']}/{c['seed']}/"
            kept = {k.removeprefix(prefix): v for k, v in bits.items() if k.startswith(prefix)}
            futures[pool.submit(verify, c, kept)] = i
        for fut in as_completed(futures):
            c = cases[futures[fut]]
            c["check"] = fut.result()
            print(
                f"{c['kernel']} n {c['n']} h {c['heads']} d {c['d']} {c['dtype']} causal {c['causal']}: "
                f"{_verdict(c['check'])} "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
            out.write_text(json.dumps(rec, indent=1))
    for name in sorted({c["kernel"] for c in cases}):
        mine = [c for c in cases if c["kernel"] == name and "check" in c]
        whole = sum(bool(c["check"].get("up_to_atomic_order")) for c in mine)
        print(f"fresh_verify {name}: {whole} of {len(mine)} checked identical (up to atomic order)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.fresh_verify", description=__doc__.split("\n")[0])
    ap.add_argument("recording", help="a fresh_check.json")
    ap.add_argument("--bits", nargs="*", default=[], help="the recording's fresh_bits_<i>.npz files")
    ap.add_argument("--kernels", default="", help="comma list: check only these kernels' cases")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--again", action="store_true", help="check cases the device checked too")
    ap.add_argument(
        "--launch-policy",
        action="store_true",
        help="derive each case's policy from its launch again (the kernel's policy_for now) and check the cases "
        "whose policy that changes",
    )
    ap.add_argument("--out", help="where the checked recording goes (default: over the recording)")
    args = ap.parse_args(argv)
    return run_command("fresh_verify", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
