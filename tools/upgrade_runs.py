"""Convert kernel-run files written before runs named their policy: 'policy_args' -> a policy reference.

    python -m tools.upgrade_runs RUN.npz|DIR ...

A `flashsim.crosscheck.save_run` file used to store the keyword arguments of the project's Triton kernels'
policy (`"policy_args"`: dtype, tiles, warps) in its meta; it now stores a policy reference
(`"policy": {"target": "gpu.policies:triton_policy", "kwargs": ...}`, `flashsim.policy.PolicyRef`),
so that any kernel's runs name their own policy.  This rewrites each old file in place: the same arrays,
the meta with 'policy_args' replaced by that reference, nothing else changed; files already converted are
left alone.  Each file is then loaded and checked against the emulator (exit status 1 if one is not
bit-identical).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from flashsim.crosscheck import crosscheck, load_run

TARGET = "gpu.policies:triton_policy"  # what 'policy_args' were the arguments of


def upgrade(path: Path) -> bool:
    """Rewrite `path` if it is an old run file; True if it was rewritten."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    if "policy_args" not in meta:
        return False
    new = {k: ({"target": TARGET, "kwargs": v} if k == "policy_args" else v) for k, v in meta.items()}
    new = {("policy" if k == "policy_args" else k): v for k, v in new.items()}
    arrays["meta"] = np.array(json.dumps(new))
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.upgrade_runs", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run files (.npz), or folders of them")
    args = ap.parse_args(argv)
    paths = []
    for name in args.runs:
        p = Path(name)
        paths += sorted(p.glob("*.npz")) if p.is_dir() else [p]
    bad = 0
    for p in paths:
        done = upgrade(p)
        same = crosscheck(load_run(p)).identical
        bad += not same
        print(
            f"{p}: {'converted' if done else 'already current'}; "
            f"{'bit-identical to the emulator' if same else 'DIFFERS from the emulator'}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
