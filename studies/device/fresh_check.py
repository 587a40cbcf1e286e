"""Other people's kernels on fresh launches through the documented path alone, forward and backward: each
launch run by `gpu.crosscheck.kernels.kernel_run` (the policy from the launch that ran: the card's SM count,
the autotuner's tiles), every output checked by `flashsim.crosscheck` in worker processes as it is recorded.

    PYTHONPATH=. python -m studies.device.fresh_check --out $OUT --tutorial PATH/06-fused-attention.py \\
        --paper PATH/attention.py [--kernels sdpa_flash,...] [--cases 100] [--start 0] [--budget 300] [--workers 15]

Kernels: ours (`gpu.flash` by `gpu.crosscheck.live.live_run`: bf16, fp16 and FP8 E4M3, cast_sum and the standard
softmax), SDPA's flash, memory-efficient and cuDNN backends (their default, nondeterministic paths), Triton's tutorial
(autotuned, fp16: its TMA forward does not compile for bf16; key counts whole 128-key tiles, as it requires; its
backward only for causal runs, the only ones it computes), Qiu & Yao's attention.py (bf16, fix off and on) and
FlashAttention-4 (`flash-attn-4`'s Hopper kernels, its backward deterministic in every other case). Cases cycle through
batch x heads 1 to 64 and key counts 1 to 8192 (FA2's split launches among them), head dims 64 and 128, causal and not,
bf16 and fp16, inputs of every kind from seeds no other recording uses; the kernels take turns so that each gets its
share of the budget. Writes `fresh_check.json`: per case its inputs (kinds, seed), the launch, the SHA-256 of every
output's bits, and the cross-check: identical fractions, atomically summed outputs admitted by some order of their adds
(`flashsim.atomics`), the attention line and the launch notes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from flashsim.inputs import EVERY_KIND
from flashsim.recording import sha256_of
from gpu.commands import require_gpu, sections

SEED0 = 2_026_700_000  # fresh: no other recording draws from here
SEED_CI = 2_026_900_000  # the CI grid's: small launches the CPU re-derives (tests/data/fresh_check)
KERNELS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "tutorial", "paper", "ours", "fa4")
#: (key count, batch x heads), cycled: heads x keys^2 at most 2^26, most far less (the emulator's time)
SHAPES = (
    (8192, 1),
    (1, 64),
    (64, 16),
    (1024, 8),
    (7, 4),
    (200, 24),
    (2048, 2),
    (100, 64),
    (333, 16),
    (4096, 1),
    (128, 8),
    (1000, 4),
    (513, 3),
    (256, 64),
    (1536, 2),
    (77, 32),
    (640, 5),
    (3000, 1),
    (512, 12),
    (129, 1),
    (2100, 1),
    (384, 32),
    (999, 2),
    (40, 48),
    (1100, 6),
)

#: the CI grid's (key count, batch x heads): launches small enough for the CPU to re-derive in seconds
CI_SHAPES = ((1, 1), (7, 2), (33, 1), (64, 2), (77, 1), (100, 2), (128, 1), (129, 2), (200, 1), (256, 1), (250, 2))


def grid(
    kernel: str, count: int, ci: bool = False, kinds: tuple[str, ...] = (), dtype: str | None = None
) -> list[dict]:
    """``count`` cases of `kernel`: seed SEED0 (SEED_CI for the CI grid) + 10^6 (kernel's index) + 100 i; head h
    of case i draws kind ALL_KINDS[(i + h) mod 7] from seed + h, or ``kinds[h mod len(kinds)]`` where given
    (`flashsim.inputs.NAMED_KINDS` among them); ``dtype`` (bf16 or fp16) for the kernels that take both."""
    k = KERNELS.index(kernel)
    shapes = CI_SHAPES if ci else SHAPES
    cases = []
    for i in range(count):
        n, heads = shapes[(i + 3 * k) % len(shapes)]
        if ci and kernel == "paper":
            n = max(8, -(-n // 8) * 8)  # whole 8-key rows: cuBLAS's other GEMMs at other widths are not modelled
        dt = dtype or ("bf16", "fp16")[(i // 2) % 2]
        if kernel == "tutorial":
            n = max(128, -(-n // 128) * 128)  # whole 128-key tiles: the tutorial asserts it
            heads = max(1, min(heads, (1 << 26) // (n * n)))
        if kernel in ("paper", "tutorial"):  # their own: Qiu & Yao's runs under bf16 autocast, the tutorial's
            dt = "bf16" if kernel == "paper" else "fp16"  # TMA forward does not compile for bf16
        if kernel == "ours" and dtype is None:  # every dtype our kernels take (FP8: the forward, P V promoted)
            dt = ("bf16", "fp16", "e4m3")[i % 3]
        extra = {"deterministic": i % 2 == 0} if kernel == "fa4" else {}  # FA4's backward: both paths
        extra |= {"kinds": list(kinds)} if kinds else {}
        cases.append(
            {
                "kernel": kernel,
                "n": n,
                "heads": heads,
                "d": (64, 128)[(i // len(shapes) + i) % 2],
                "dtype": dt,
                "causal": bool((i // 3) % 2),
                "softmax": _softmax(kernel, i),
                "seed": (SEED_CI if ci else SEED0) + 1_000_000 * k + 100 * i,
                "first_kind": i,
            }
            | extra
        )
    return cases


def _softmax(kernel: str, i: int) -> str:
    """Case i's softmax: Qiu & Yao's fix off and on; ours the default (cast_sum), every fourth the standard one; the
    others the standard softmax, the only one they compute."""
    if kernel == "paper":
        return "stabilised" if (i // 5) % 2 else "standard"
    if kernel == "ours":
        return "standard" if i % 4 == 3 else "cast_sum"
    return "standard"


def case_inputs(case: dict) -> dict[str, np.ndarray]:
    """q, k, v, do of the case as (heads, n, d) float32 arrays of its dtype's values."""
    from flashsim.inputs import case_kinds, make_heads

    return make_heads(case_kinds(case), case["heads"], case["n"], case["n"], case["d"], case["dtype"], case["seed"])


def case_softmax(case: dict):
    """The variant the case ran: Qiu & Yao's fix counts masked entries as their code does."""
    from flashsim.softmax import get_softmax

    return get_softmax(case["softmax"], **({"count_masked": True} if case["softmax"] == "stabilised" else {}))


def with_backward(case: dict) -> bool:
    """Whether the case records dQ, dK, dV: the tutorial's backward computes causal attention's only, and our FP8
    kernels have a forward only."""
    if case["kernel"] == "ours":
        return case["dtype"] != "e4m3"
    return case["kernel"] != "tutorial" or case["causal"]


def case_run(case: dict, outputs: dict[str, np.ndarray] | None = None):
    """The recorded case as a `KernelRun` from its seed: ``outputs`` the GPU's bits, where known (None: zeros of
    each recorded output's shape, for emulating)."""
    from flashsim.crosscheck import KernelRun
    from flashsim.policy import PolicyRef

    x = case_inputs(case)
    h, n, d = x["q"].shape
    if outputs is None:
        outputs = {
            k: np.zeros((h, n, d), np.uint16) if k in ("o", "dq", "dk", "dv") else np.zeros((h, n), np.uint32)
            for k in case["digests"]
        }
    return KernelRun(
        q=x["q"],
        k=x["k"],
        v=x["v"],
        do=x["do"] if "dq" in case["digests"] else None,
        dtype=case["dtype"],
        causal=case["causal"],
        sm_scale=case["d"] ** -0.5,
        softmax=case_softmax(case),
        policy=PolicyRef.from_json(case["policy"]),
        outputs=outputs,
        launch=case["launch"],
        note=f"{case['kernel']} seed {case['seed']}",
    )


def emulated_outputs(case: dict) -> dict[str, np.ndarray]:
    """The bits of every output the policy the case recorded computes from the case's seed."""
    from flashsim.crosscheck import emulate

    return {k: v for k, v in emulate(case_run(case)).items() if k in case["digests"]}


def emulated_digests(case: dict) -> dict[str, str]:
    """The SHA-256 of every output the policy the case recorded computes from the case's seed: what a recorded
    case's digests are checked against on the CPU."""
    return {k: sha256_of(v) for k, v in emulated_outputs(case).items()}


def register_checkout_policies() -> None:
    """Register what installed entry points would (a checkout run from PYTHONPATH=. declares none): `qiu_yao`, and the
    policy functions of gpu.policies."""
    import gpu.policies  # noqa: F401
    from flashsim.policy import get_policy, register_policy
    from gpu.policies.qiu_yao import QIU_YAO

    try:
        get_policy(QIU_YAO.name)
    except ValueError:
        register_policy(QIU_YAO)


def summary(rep) -> dict:
    """What a case keeps of its cross-check (a `CrosscheckReport`)."""
    return {
        "identical": {c.name: c.fraction for c in rep.checks},
        "atomic": {name: {"ok": a.ok, "line": str(a)} for name, a in rep.atomic.items()},
        "up_to_atomic_order": rep.identical_up_to_atomic_order,
        "attention": None if rep.attention is None else rep.attention.attention,
        "launch_notes": rep.launch_notes,
    }


def check_run(path: str) -> dict:
    """One saved run against its policy, the file removed after (a worker process)."""
    from flashsim.crosscheck import crosscheck, load_run

    register_checkout_policies()
    t0 = time.monotonic()
    try:
        rep = crosscheck(load_run(path))
    except Exception as exc:  # noqa: BLE001 - a launch the policy cannot model is a result
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    finally:
        os.unlink(path)
    return summary(rep) | {"seconds": round(time.monotonic() - t0, 1)}


def gather_checks(pool: ProcessPoolExecutor, futures: list[tuple[dict, Future]], deadline: float) -> None:
    """Each case's check (a future of `check_run`) into its ``check``, waiting until ``deadline`` (a
    `time.monotonic()` value) at most: a check past it (or crashed) is said, and its process killed, not waited
    for."""
    for case, fut in futures:
        try:
            case["check"] = fut.result(timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - said, not lost
            case["check"] = {"error": f"{type(exc).__name__}: {exc}"[:300] or "past the deadline"}
    for proc in list(pool._processes.values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def atomic_outputs(run) -> list[str]:
    """The outputs the run's policy sums with atomic adds: their bits may be any order's, so a digest alone cannot
    judge them."""
    pol = run.resolve_policy()
    return [k for k in ("dq", "dk", "dv") if k in run.outputs and getattr(pol, k).atomic]


def save_bits(
    out: Path, bits: dict[str, np.ndarray], cap: int, chunk: int = 15 << 20, stem: str = "fresh_bits"
) -> list[str]:
    """``bits`` into <stem>_<i>.npz files of at most ``chunk`` bytes each before compression, ``cap`` bytes in all
    (what one device call returns); returns the keys left out."""
    chunks: list[dict[str, np.ndarray]] = [{}]
    left, total = [], 0
    for key, value in bits.items():
        if total + value.nbytes > cap or value.nbytes > chunk:
            left.append(key)
            continue
        if sum(v.nbytes for v in chunks[-1].values()) + value.nbytes > chunk:
            chunks.append({})
        chunks[-1][key] = value
        total += value.nbytes
    for i, c in enumerate(c for c in chunks if c):
        np.savez_compressed(out / f"{stem}_{i}.npz", **c)
    return left


def _kernel(name: str, case: dict, tutorial, paper, paper_gemms: bool = False):
    from gpu.crosscheck.flash_attn4 import fa4
    from gpu.crosscheck.kernels import sdpa
    from gpu.crosscheck.upstream import paper_kernel, tutorial_kernel

    if name == "fa4":  # FlashAttention-4 (flash-attn-4): its backward deterministic or not, as the case says
        return fa4(deterministic=case.get("deterministic", True))
    if name == "tutorial":
        return tutorial_kernel(tutorial)
    if name == "paper":  # cuBLAS's kernels profiled where a tile is off 8-key alignment (CUTLASS runs there)
        profile = paper_gemms and bool(case["n"] % 8 or case["d"] % 8)
        return paper_kernel(paper, stable=case["softmax"] == "stabilised", gemms=profile)
    return sdpa(name.removeprefix("sdpa_"))


def _launch(case: dict, kernels: dict, tutorial, paper, paper_gemms: bool = False):
    """One kernel_run of the case (its backward too where the kernel has one for it)."""
    from gpu.crosscheck.kernels import kernel_run
    from gpu.crosscheck.live import live_run

    x = case_inputs(case)
    inputs = (x["q"], x["k"], x["v"], x["do"] if with_backward(case) else None)
    common = {
        "dtype": case["dtype"],
        "causal": case["causal"],
        "note": f"fresh_check {case['kernel']} seed {case['seed']}",
    }
    if case["kernel"] == "ours":  # gpu.flash as users call it (the forward kernel "auto" picks), its own policy
        return live_run(*inputs, softmax=case["softmax"], debug=False, **common)
    kernel = _kernel(case["kernel"], case, tutorial, paper, paper_gemms)
    return kernel_run(kernel, *inputs, sm_scale=case["d"] ** -0.5, softmax=case_softmax(case), **common)


def run(args) -> int:
    kernels = sections(args.kernels, KERNELS, "--kernels")
    for name, path in (("tutorial", args.tutorial), ("paper", args.paper)):
        if name in kernels and (path is None or not Path(path).is_file()):
            raise UsageError(f"--{name}: the file is needed for the {name} kernel, got {path}")
    keep = sections(args.keep_bits, KERNELS, "--keep-bits") if args.keep_bits else []
    checked = sections(args.check, KERNELS, "--check") if args.check else kernels
    kinds = tuple(sections(args.kinds, EVERY_KIND, "--kinds")) if args.kinds else ()
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.fresh_check")
    import torch

    from flashsim.crosscheck import save_run
    from flashsim.policy import PolicyRef
    from gpu.crosscheck.upstream import load_paper, load_tutorial

    register_checkout_policies()
    tutorial = load_tutorial(args.tutorial) if "tutorial" in kernels else None
    paper = load_paper(args.paper) if "paper" in kernels else None
    tmp = Path(tempfile.mkdtemp(prefix="fresh_check_"))
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    pool = None
    if args.workers:
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
    per_kernel = {name: grid(name, args.cases, args.grid == "ci", kinds, args.dtype) for name in kernels}
    order = [per_kernel[name][i] for i in range(args.start, args.cases) for name in kernels]  # the kernels take turns
    t0, futures, bits, atomic = time.monotonic(), [], {}, {}
    for j, case in enumerate(order):
        if time.monotonic() - t0 > args.budget:
            break
        try:
            run_ = _launch(case, kernels, tutorial, paper, args.paper_gemms)
            again = _launch(case, kernels, tutorial, paper).outputs if args.repeat else None
        except Exception as exc:  # noqa: BLE001 - a refused launch is a result
            case["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            print(f"{case['kernel']} seed {case['seed']}: {case['error'][:300]}", flush=True)
            continue
        ref = run_.policy if isinstance(run_.policy, PolicyRef) else PolicyRef(run_.policy.name)
        case["policy"] = ref.to_json()
        case["launch"] = run_.launch
        case["digests"] = {k: sha256_of(v) for k, v in run_.outputs.items()}
        if again is not None:  # outputs that differ between two identical launches: the GPU's order of atomics
            case["varies"] = sorted(k for k, v in again.items() if not np.array_equal(v, run_.outputs[k]))
        if case["kernel"] in keep:
            bits.update({f"{case['kernel']}/{case['seed']}/{k}": v for k, v in run_.outputs.items()})
        else:  # kept should no check finish here: what a digest cannot judge
            atomic.update({f"{case['kernel']}/{case['seed']}/{k}": run_.outputs[k] for k in atomic_outputs(run_)})
        if pool is not None and case["kernel"] in checked:
            futures.append((case, pool.submit(check_run, str(save_run(tmp / f"case{j}.npz", run_)))))
        print(
            f"{case['kernel']} n {case['n']} h {case['heads']} d {case['d']} {case['dtype']} causal {case['causal']} "
            f"recorded {time.monotonic() - t0:.0f} s",
            flush=True,
        )
    if pool is not None:
        gather_checks(pool, futures, t0 + args.deadline)
    cases = [c for name in kernels for c in per_kernel[name] if "digests" in c or "error" in c]
    done = {f"{c['kernel']}/{c['seed']}" for c in cases if "identical" in c.get("check", {})}
    bits.update({key: v for key, v in atomic.items() if key.rsplit("/", 1)[0] not in done})
    left = save_bits(out, bits, args.bits_cap << 20) if bits else []
    if left:
        print(f"fresh_check: {len(left)} outputs' bits over --bits-cap, not kept: {', '.join(left[:20])}")
    for name in kernels:
        mine = [c for c in cases if c["kernel"] == name and "check" in c]
        whole = sum(bool(c["check"].get("up_to_atomic_order")) for c in mine)
        recorded = sum("digests" in c for c in cases if c["kernel"] == name)
        print(f"fresh_check {name}: {recorded} recorded; {whole} of {len(mine)} checked identical (up to atomic order)")
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "triton": __import__("triton").__version__,
        "command": "PYTHONPATH=. python -m studies.device.fresh_check --out $OUT"
        + (" --tutorial .upstream/triton_06_fused_attention.py" if "tutorial" in kernels else "")
        + (" --paper .upstream/qiu_yao_attention.py" if "paper" in kernels else "")
        + f" --grid {args.grid} --kernels {args.kernels} --cases {args.cases} --start {args.start} "
        f"--workers {args.workers}"
        + (f" --check {args.check}" if args.check else "")
        + (" --repeat" if args.repeat else "")
        + (" --paper-gemms" if args.paper_gemms else "")
        + (f" --keep-bits {args.keep_bits}" if args.keep_bits else "")
        + (f" --kinds {args.kinds}" if args.kinds else "")
        + (f" --dtype {args.dtype}" if args.dtype else ""),
        "files_sha256": {
            name: sha256_of(np.frombuffer(Path(p).read_bytes(), np.uint8))
            for name, p in (("tutorial", args.tutorial), ("paper", args.paper))
            if name in kernels
        },
        "bits_left_out": left,
        "cases": cases,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "fresh_check.json").write_text(json.dumps(meta, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.fresh_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {', '.join(KERNELS)}")
    ap.add_argument("--tutorial", help="the Triton tutorial's 06-fused-attention.py (imported: you name it)")
    ap.add_argument("--paper", help="Qiu & Yao's attention.py (imported: you name it)")
    ap.add_argument("--cases", type=int, default=100, help="cases a kernel at most (default 100)")
    ap.add_argument("--start", type=int, default=0, help="skip each kernel's first cases (an earlier call's)")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds after which no new case starts")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds after which unfinished checks are dropped")
    ap.add_argument("--workers", type=int, default=12, help="processes cross-checking the runs (0: record only)")
    ap.add_argument("--grid", choices=("fresh", "ci"), default="fresh", help="fresh launches, or the CI grid's")
    ap.add_argument("--repeat", action="store_true", help="launch each case twice; record the outputs that vary")
    ap.add_argument(
        "--paper-gemms",
        action="store_true",
        help="profile the paper's einsums where its key count is not a multiple of 8 (the kernels cuBLAS ran)",
    )
    ap.add_argument("--keep-bits", default="", help="kernels all of whose outputs' bits are kept (fresh_bits_<i>.npz)")
    ap.add_argument("--check", default="", help="kernels checked here as recorded (default: all; the rest by digest)")
    ap.add_argument("--bits-cap", type=int, default=56, help="MiB of bits kept at most (default 56)")
    ap.add_argument(
        "--kinds", default="", help="input kinds every case's heads draw in turn (default: the rotation of all kinds)"
    )
    ap.add_argument("--dtype", choices=("bf16", "fp16"), help="the dtype of every kernel that takes both")
    args = ap.parse_args(argv)
    return run_command("fresh_check", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
