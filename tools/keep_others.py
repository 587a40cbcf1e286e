"""Keep a subset of a record_kernels.py recording as test data (the CI checks it bit for bit on every run).

    PYTHONPATH=. python tools/keep_others.py SRC DST --kernel sdpa_flash --cells 64:128,128:200 --backward bf16

Keeps, of ``--kernel``'s recorded cases in SRC, those whose (head dim, N) is one of ``--cells``: O and LSE of
each (DST/others.npz), and dQ, dK, dV of those whose dtype is in ``--backward`` (DST/others_bwd.npz), with
SRC's others.json cut to them and a ``kept`` line saying so (DST/others.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emufloat.console import ArgumentParser  # noqa: E402
from gpu.crosscheck import others  # noqa: E402


def _cells(text: str) -> set[tuple[int, int]]:
    try:
        return {tuple(int(v) for v in cell.split(":")) for cell in text.split(",")}  # type: ignore[misc]
    except ValueError:
        raise SystemExit(f"--cells: expected HEAD_DIM:N pairs separated by commas, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python tools/keep_others.py", description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="a record_kernels.py output folder")
    ap.add_argument("dst", type=Path, help="the folder to write (tests/data/...)")
    ap.add_argument("--kernel", required=True, choices=others.KERNELS)
    ap.add_argument("--cells", required=True, help="HEAD_DIM:N pairs to keep, e.g. 64:128,128:200")
    ap.add_argument("--backward", default="", help="dtypes whose dQ, dK, dV are kept (comma list)")
    ap.add_argument("--recorded-by", help="the command that made SRC, where its others.json does not say")
    args = ap.parse_args(argv)
    cells = _cells(args.cells)
    meta, arrays = others.load(args.src)
    kept = [
        rec
        for rec in meta["cases"]
        if rec["case"]["kernel"] == args.kernel and (rec["case"]["d"], rec["case"]["n"]) in cells and "error" not in rec
    ]
    back = {d for d in args.backward.split(",") if d}
    fwd, bwd = {}, {}
    for rec in kept:
        key = others.KernelCase(**rec["case"]).key
        fwd.update({f"{key}/{n}": arrays[f"{key}/{n}"] for n in ("o", "lse")})
        if rec["case"]["dtype"] in back:
            bwd.update({f"{key}/{n}": arrays[f"{key}/{n}"] for n in ("dq", "dk", "dv")})
    args.dst.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.dst / "others.npz", **fwd)
    if bwd:
        np.savez_compressed(args.dst / "others_bwd.npz", **bwd)
    out = {k: v for k, v in meta.items() if k != "cases"}
    if args.recorded_by:
        out["recorded_by"] = args.recorded_by
    if "recorded_by" not in out:
        raise SystemExit("--recorded-by: SRC's others.json does not say how it was recorded; give the command")
    out["kept"] = (
        f"{len(kept)} {args.kernel} cases (head dim:N in {args.cells}): forward O and LSE"
        + (f"; dQ, dK, dV of the {', '.join(sorted(back))} ones" if back else "")
        + f" (python tools/keep_others.py SRC DST --kernel {args.kernel} --cells {args.cells}"
        + (f" --backward {args.backward})" if back else ")")
    )
    out["cases"] = kept
    (args.dst / "others.json").write_text(json.dumps(out, indent=1))
    print(out["kept"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
