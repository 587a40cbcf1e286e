"""Keep a record_kernels.py recording (other people's kernels) in the repository compactly, as test data.

    python -m tools.keep_others SRC DST [--kernel sdpa_flash] [--cells 64:128,128:200] [--backward bf16]
    python -m tools.keep_others SRC DST --like DST     # a re-recording: the cases DST keeps now

Keeps, of the recorded cases in SRC (of `--kernel`; all by default), those whose (head dim, N) is one of
`--cells` (all by default): the SHA-256 of O and LSE of each, and of dQ, dK, dV of those whose dtype is in
`--backward`, in DST/others.json with SRC's others.json cut to them and a `kept` line saying so
(`flashsim.recording`).  `--like FOLDER` keeps instead the cases a folder kept before holds (the same keys:
record_kernels.py draws them from the same seeds), with dQ, dK, dV where it has them.  Every kept case is
emulated under its policy first: an output the emulator does not reproduce (the cuDNN backward, the
memory-efficient backend's dQ over several key splits) is kept as a patch, the elements where the GPU differs,
in DST/others.npz, which the tests rebuild the GPU's bits from.  SRC may also be a folder this tool wrote (a
subset of it kept again).
"""

from __future__ import annotations

from pathlib import Path

from flashsim.recording import Recording
from gpu.crosscheck import others
from tools.keep_recording import patches_of, recording_entry


def _cells(text: str | None) -> set[tuple[int, int]] | None:
    if not text:
        return None
    try:
        return {tuple(int(v) for v in cell.split(":")) for cell in text.split(",")}  # type: ignore[misc]
    except ValueError:
        raise SystemExit(f"--cells: expected HEAD_DIM:N pairs separated by commas, got {text!r}") from None


def keep(
    src: Path,
    dst: Path,
    kernel: str | None = None,
    cells: set[tuple[int, int]] | None = None,
    backward: set[str] = frozenset(),
    recorded_by: str | None = None,
    kept_line: str | None = None,
    like: Recording | None = None,
) -> Recording:
    """DST/others.json (and others.npz where some output is patched) from the recording folder `src`;
    `kept_line`: what others.json says was kept (default: the selection, in words); `like`: keep the cases
    (and gradients) this recording holds instead."""
    full = others.recording(src)
    meta = full.meta
    kept = [
        rec
        for rec in meta["cases"]
        if (kernel is None or rec["case"]["kernel"] == kernel)
        and (cells is None or (rec["case"]["d"], rec["case"]["n"]) in cells)
        and (like is None or f"{others.KernelCase(**rec['case']).key}/o" in like)
        and "error" not in rec
    ]
    keys = []
    for rec in kept:
        key = others.KernelCase(**rec["case"]).key
        keys += [f"{key}/{n}" for n in ("o", "lse")]
        if rec["case"]["dtype"] in backward or (like is not None and f"{key}/dq" in like):
            keys += [f"{key}/{n}" for n in ("dq", "dk", "dv") if f"{key}/{n}" in full]
    if like is not None:
        missing = sorted({k[: -len("/o")] for k in like.keys() if k.endswith("/o")} - {k[: -len("/o")] for k in keys})
        if missing:
            raise SystemExit(f"--like: {src} lacks {len(missing)} of the cases to keep, e.g. {missing[:3]}")
        kept_line = kept_line or like.meta.get("kept")
    out = {k: v for k, v in meta.items() if k not in ("cases", "recording")}
    if recorded_by:
        out["recorded_by"] = recorded_by
    if "recorded_by" not in out:
        raise SystemExit("--recorded-by: SRC's others.json does not say how it was recorded; give the command")
    names = sorted({rec["case"]["kernel"] for rec in kept})
    cells_text = ",".join(f"{d}:{n}" for d, n in sorted(cells)) if cells else "all"
    how = f"{len(kept)} {', '.join(names)} cases (head dim:N in {cells_text}): forward O and LSE" + (
        f"; dQ, dK, dV of the {', '.join(sorted(backward))} ones" if backward else ""
    )
    out["kept"] = kept_line or how
    out["recording"] = recording_entry(
        out["recorded_by"],
        f"{how}, as the SHA-256 of their bits; others.npz: the patches of the outputs the emulator does not "
        "reproduce (the GPU's bits where they differ)",
        "gpu.crosscheck.others.KernelCase.inputs(): flashsim.inputs.make_inputs(kind, n, n, d, dtype, seed)",
        "python -m tools.keep_others SRC DST"
        + (f" --kernel {kernel}" if kernel else "")
        + (f" --cells {cells_text}" if cells else "")
        + (f" --backward {','.join(sorted(backward))}" if backward else ""),
    )
    out["cases"] = kept
    bits = {k: full.bits(k) if k in full.kept else None for k in keys}
    part = Recording(out, {k: full.digests[k] for k in keys}, {}, {k: p for k, p in full.patches.items() if k in keys})
    runs = [run for run in (others.recorded_run_of(rec, part, bool(out.get("deterministic"))) for rec in kept) if run]
    if all(b is not None for b in bits.values()):  # the GPU's bits: emulate every run, patch where they differ
        patches, lines = patches_of(runs, bits)
        part.patches = patches
    else:  # a compact source: its patches carry over; every run must still rebuild its bits
        lines = []
    for run in runs:
        run.outputs()  # the GPU's bits, rebuilt from the emulator (and the patches) and proven by the digests
    dst.mkdir(parents=True, exist_ok=True)
    part.save(dst / "others.json")
    for stale in ("others_bwd.npz",):
        if (dst / stale).exists():
            (dst / stale).unlink()
    print(f"{dst}: {how}; {len(lines)} cases differ from the emulator (patched)")
    for line in lines[:10]:
        print("  " + line)
    return part


def main(argv: list[str] | None = None) -> int:
    from flashsim.console import ArgumentParser

    ap = ArgumentParser(prog="python -m tools.keep_others", description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="a record_kernels.py output folder")
    ap.add_argument("dst", type=Path, help="the folder to write (tests/data/...)")
    ap.add_argument("--kernel", choices=others.KERNELS, help="only this kernel's cases (default: all)")
    ap.add_argument("--cells", help="HEAD_DIM:N pairs to keep, e.g. 64:128,128:200 (default: all)")
    ap.add_argument("--backward", default="", help="dtypes whose dQ, dK, dV are kept (comma list)")
    ap.add_argument("--recorded-by", help="the command that made SRC, where its others.json does not say")
    ap.add_argument("--like", type=Path, help="keep the cases this kept folder holds (a re-recording of them)")
    args = ap.parse_args(argv)
    if not (args.src / "others.json").is_file():
        ap.error(f"src: {args.src} holds no others.json (a record_kernels.py output folder is expected)")
    like = others.recording(args.like) if args.like else None
    backward = {d for d in args.backward.split(",") if d}
    keep(args.src, args.dst, args.kernel, _cells(args.cells), backward, args.recorded_by, like=like)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
