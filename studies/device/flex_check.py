"""FlexAttention on fresh cases through the documented path alone: `gpu.crosscheck.kernels.flex_attention` run by
`kernel_run` (the policy from the launch that ran, its tiles read from Inductor's source; sliding-window and
document masks as matrices), each run checked by `flashsim.crosscheck` in worker processes as it is recorded.

    PYTHONPATH=. python -m studies.device.flex_check --out $OUT [--budget 400] [--workers 15] [--start 0]
        [--backward] [--kinds subnormal]

Cases: heads 1 to 64, key counts 1 to 8192 (whole tiles and not), head dims 64 and 128, bf16 and fp16, masks
none, causal, sliding window, documents; inputs of every kind from seeds no other recording uses.  Writes
`flex_check.json`: per case its inputs (kinds, seed), the launch (tiles, versions, card), the SHA-256 of O and
LSE (and, with ``--backward``, of dQ, dK, dV), and the cross-check's identical fractions and attention line; the
bits of the cases the policy refused or missed go to flex_bits_<i>.npz (for diagnosis).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from flashsim.console import ArgumentParser, run_command, writable_dir
from flashsim.inputs import EVERY_KIND
from flashsim.recording import sha256_of
from gpu.commands import require_gpu, sections
from studies.device.flex_capture import WINDOW, case_inputs, document_ids, mask_mod
from studies.device.fresh_check import check_run, gather_checks, save_bits

SEED0 = 2_026_600_000  # fresh: no other recording draws from here
SHAPES = (  # (key count, heads): heads x keys^2 at most 2^26
    (1, 64),
    (7, 16),
    (64, 64),
    (100, 32),
    (128, 8),
    (200, 64),
    (333, 16),
    (512, 4),
    (1000, 8),
    (1024, 64),
    (2048, 2),
    (2100, 4),
    (4096, 1),
    (4000, 2),
    (8192, 1),
    (777, 3),
)
MASKS = ("none", "causal", "sliding", "document")


def grid(count: int = 128, kinds: tuple[str, ...] = ()) -> list[dict]:
    """``count`` cases: shapes, head dims, dtypes and masks in turn; head h of case i draws `flashsim.inputs.ALL_KINDS`
    [(i + h) mod 7], or ``kinds[h mod len(kinds)]`` where given (bf16 then, as a named kind may need)."""
    cases = []
    for i in range(count):
        n, heads = SHAPES[i % len(SHAPES)]
        cases.append(
            {
                "n": n,
                "heads": heads,
                "d": (64, 128)[(i // len(SHAPES)) % 2],
                "dtype": "bf16" if kinds else ("bf16", "fp16")[(i // 2) % 2],
                "mask": MASKS[(i // 4) % 4 if i % 3 else i % 4],
                "seed": SEED0 + 100 * i,
                "first_kind": i,
            }
            | ({"kinds": list(kinds)} if kinds else {})
        )
    return cases


def run(args) -> int:
    kinds = tuple(sections(args.kinds, EVERY_KIND, "--kinds")) if args.kinds else ()
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.flex_check")
    import torch

    from flashsim.crosscheck import save_run
    from gpu.crosscheck.kernels import flex_attention, kernel_run

    tmp = Path(tempfile.mkdtemp(prefix="flex_check_"))
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
    torch._dynamo.config.recompile_limit = 4096
    only = {int(i) for i in args.only.split(",") if i.strip()} if args.only else set()
    t0, cases, futures, outputs = time.monotonic(), grid(args.cases, kinds), [], {}
    for i, case in enumerate(cases):
        if i < args.start or (only and i not in only):
            continue
        if time.monotonic() - t0 > args.budget:
            break
        n = case["n"]
        if case["mask"] in ("sliding", "document"):  # causal: the kernel's own, from the run's causal flag
            doc = torch.from_numpy(document_ids(n, case["seed"])).cuda()
            kernel = flex_attention(mask_mod(case["mask"], doc), f"flex_{case['mask']}")
        else:
            kernel = flex_attention()
        x = case_inputs(case)
        try:
            run_ = kernel_run(
                kernel,
                x["q"],
                x["k"],
                x["v"],
                x["do"] if args.backward else None,
                dtype=case["dtype"],
                causal=case["mask"] == "causal",
                note=f"flex_check case {i}",
            )
        except Exception as exc:  # noqa: BLE001 - a refused launch is a result
            case["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            print(f"case {i}: {case['error'][:300]}", flush=True)
            continue
        case["launch"] = run_.launch
        case["digests"] = {k: sha256_of(v) for k, v in run_.outputs.items()}
        outputs[i] = run_.outputs
        path = save_run(tmp / f"case{i}.npz", run_)
        futures.append((case, pool.submit(check_run, str(path))))
        print(
            f"case {i} ({case['mask']} n {n} h {case['heads']} d {case['d']} {case['dtype']}) recorded "
            f"{time.monotonic() - t0:.0f} s",
            flush=True,
        )
    gather_checks(pool, futures, t0 + args.deadline)
    done = [c for c in cases if "check" in c]
    refused = [c for c in cases if "error" in c]
    whole = sum(all(f == 1.0 for f in c["check"].get("identical", {0: 0}).values()) for c in done)
    print(f"flex_check: {whole} of {len(done)} cases identical in every output; {len(refused)} refused", flush=True)
    missed = {
        f"case{i}/{k}": v
        for i, got in outputs.items()
        if not all(f == 1.0 for f in cases[i]["check"].get("identical", {0: 0}).values())
        for k, v in got.items()
    }
    left = save_bits(out, missed, args.bits_cap << 20, stem="flex_bits") if missed else []
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": f"PYTHONPATH=. python -m studies.device.flex_check --out $OUT --cases {args.cases} "
        f"--start {args.start}"
        + (" --backward" if args.backward else "")
        + (f" --only {args.only}" if args.only else "")
        + (f" --kinds {args.kinds}" if args.kinds else ""),
        "bits_left_out": left,
        "window": WINDOW,
        "cases": done,
        "refused": refused,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "flex_check.json").write_text(json.dumps(meta, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.flex_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--cases", type=int, default=128, help="how many cases at most (default 128)")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds after which no new case starts")
    ap.add_argument("--workers", type=int, default=15, help="processes cross-checking the runs (default 15)")
    ap.add_argument("--start", type=int, default=0, help="skip the grid's first cases (an earlier call's)")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds after which unfinished checks are dropped")
    ap.add_argument("--backward", action="store_true", help="record and check dQ, dK, dV too")
    ap.add_argument("--only", default="", help="comma list of the grid's case indices to run (default: all)")
    ap.add_argument("--bits-cap", type=int, default=40, help="MiB of missed cases' bits kept at most (default 40)")
    ap.add_argument("--kinds", default="", help="input kinds the heads draw in turn, in bf16 (default: all kinds)")
    args = ap.parse_args(argv)
    return run_command("flex_check", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
