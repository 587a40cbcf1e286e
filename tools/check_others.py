"""Hold a recording of other people's kernels (studies/device/record_kernels.py's folder) to the emulator.

    python -m tools.check_others FOLDER [--kernel NAME]

Prints, per kernel and per dtype and for each output, the fraction of bit-identical elements and the
number of cases identical in that output, and the cases identical in every output, under the policy
`gpu.crosscheck.others.policy_of` names.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from emufloat.console import ArgumentParser
from flashsim.crosscheck import crosscheck
from gpu.crosscheck import others


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m tools.check_others", description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a record_kernels.py output folder (others.json, others.npz)")
    ap.add_argument("--kernel", choices=others.KERNELS, help="only this kernel")
    args = ap.parse_args(argv)
    if not (args.folder / "others.json").is_file():
        ap.error(f"folder: {args.folder} holds no others.json")
    identical: dict = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    whole: dict = defaultdict(lambda: [0, 0])
    for run in others.runs(args.folder, args.kernel):
        group = f"{run.note.split('_d')[0]}"  # kernel and dtype
        rep = crosscheck(run)
        for c in rep.checks:
            identical[group][c.name][0] += c.identical
            identical[group][c.name][1] += c.n
            identical[group][c.name][2] += c.identical == c.n
        whole[group][0] += rep.identical
        whole[group][1] += 1
    for group, outs in sorted(identical.items()):
        parts = ", ".join(f"{name} {100 * a / n:.4f}% ({k} cases)" for name, (a, n, k) in outs.items())
        print(f"{group:24s} {parts}; {whole[group][0]} of {whole[group][1]} cases identical in every output")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
