"""Build the H100 room's package data (emufloat/hw/h100/data: ex2 and rcp tables, tl.sum trees) from a GPU recording.

    python -m tools.build_package_data FOLDER      # $OUT of the device scripts; tests/data/h100: the trees only

FOLDER is what the device scripts wrote to $OUT: `studies/device/run_probes.sh` (results.json, exp2.npz) and, for
the rcp table, `studies/device/run_verify.sh` (rcp.npz); a table whose file is absent is skipped.  tests/data/h100
keeps the probe run's results.json (as results.json.gz), not its tables: the package data holds them, and the
device's exp2.npz and rcp.npz gave exactly its arrays.

Each table ships as int8 corrections to the correctly rounded values plus the SHA-256 of the table bits
as the GPU computed them; emufloat rebuilds the table on load and refuses it if the digest differs.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np

from studies.probes import trees as T  # numpy-only tree helpers of the probes

REPO = Path(__file__).resolve().parents[1]

KEY = re.compile(r"BM(\d+)_BN(\d+)_w(\d+)_(dot|load)")
DST = REPO / "emufloat" / "hw" / "h100" / "data"


def results(src: Path) -> dict:
    """The probe run's results.json (or results.json.gz, as tests/data/h100 keeps it)."""
    if (src / "results.json").is_file():
        return json.loads((src / "results.json").read_text())
    return json.loads(gzip.decompress((src / "results.json.gz").read_bytes()))


def build_ex2(src: Path) -> dict | None:
    if not (src / "exp2.npz").is_file():
        return None
    z = np.load(src / "exp2.npz")
    table = results(src)["probes"]["exp2"]["result"]["table"]
    out = {}
    for side in ("neg", "pos"):
        out[f"{side}_delta"] = z[f"exp2_table_{side}_delta"].astype(np.int8)
        out[f"{side}_near_idx"] = z[f"exp2_table_{side}_near_idx"].astype(np.int64)
        out[f"{side}_bits_at_near"] = z[f"exp2_table_{side}_bits_at_near"].astype(np.uint32)
        out[f"{side}_sha256"] = np.array(table[side]["sha256_table_bits"])
    out["source"] = np.array("exp2.npz + results.json of studies/device/run_probes.sh (an H100)")
    return out


def build_rcp(src: Path) -> dict | None:
    f = src / "rcp.npz"
    if not f.exists():
        return None
    z = np.load(f)
    return {
        "delta": z["rcp_table_delta"].astype(np.int8),
        "sha256": np.array(str(z["rcp_table_sha256"])),
        "source": np.array("rcp.npz of studies/device/verify_models.py (an H100)"),
    }


def build_trees(src: Path) -> dict:
    """The tl.sum trees of the reduction probe, with the facts and provenance they came with."""
    res = results(src)
    env = res["env"]
    red = res["probes"]["reduction"]
    assert red["status"] == "ok"
    driver = env["nvidia_smi"].splitlines()[-1].split(",")[-1].strip()
    ptxas = re.search(r"V[\d.]+", env["ptxas_version"]).group(0)
    configs = {}
    for key, c in red["result"]["configs"].items():
        bm, bn, w, layout = KEY.fullmatch(key).groups()
        assert c["row_invariant"] and c["n_distinct_trees"] == 1 and c["all_consistent"], key
        assert c["bad_probe_results"] == 0, key
        (t,) = c["trees"]
        assert t["rows"] == "all" and t["lca_mismatch"] == 0 and T.is_binary(t["tree"]), key
        facts = {}
        for fam, d in c["max_signed_zero_nan"].items():
            (s,) = d["sum_results"]  # one result wherever in the row the special value sits
            (m,) = d["max_results"]
            facts[fam] = {"sum": s, "max": m}
        rr = c["random_rows"]
        configs[key] = {
            "block_m": int(bm),
            "block_n": int(bn),
            "num_warps": int(w),
            "layout": layout,
            "depth": T.depth(t["tree"]),
            "thread_chains": len(T.chains(t["tree"])),
            "random_rows_matched": f"{rr['tree_model_match']}/{rr['n']}",
            "signed_zero_nan": facts,
            "tree_sha256": hashlib.sha256(json.dumps(t["tree"], separators=(",", ":")).encode()).hexdigest(),
            "tree": t["tree"],
        }
    return {
        "description": (
            "Order of Triton's tl.sum(x, 1) over an fp32 [BLOCK_M, BLOCK_N] tile on the H100, one tree per "
            "config (the same for every row of the tile); read by emufloat.hw.h100.tl_sum."
        ),
        "format": {
            "tree": "nested lists: a leaf is a column position 0..BLOCK_N-1, a node [left, right] is one "
            "add.f32 (round to nearest even) of its children; children are listed by their smallest "
            "leaf (the probe cannot see operand order, addition being commutative)",
            "layout": "dot: the tile is tl.dot(q, k, x) (wgmma accumulator layout); load: the tile is tl.load(x)",
            "tree_sha256": "SHA-256 of the tree as compact JSON (separators ',' ':'), checked on load",
            "thread_chains": "number of maximal left-deep runs (a thread folding its own registers in order)",
            "signed_zero_nan": "GPU result bits of tl.sum/tl.max for rows of: all_neg0 = -0.0 everywhere; "
            "neg0_with_pos0 = -0.0 with one +0.0; pos0_with_neg0 = +0.0 with one -0.0; "
            "nan = 1.0 with one NaN (0x7fc00000); every position tried, one result each",
            "signed_zero_nan_reading": "tl.sum is IEEE addition (-0 + -0 = -0, -0 + +0 = +0, NaN propagates; "
            "the H100 writes NaN as 0x7fffffff); tl.max is maximumNumber with "
            "-0 < +0. In the dot layout all_neg0 gives +0 for tl.max as well: the "
            "tl.dot already turned -0 into +0 (accumulator -0 plus zero products "
            "is +0), so the tile held +0 before the reduction",
        },
        "provenance": {
            "probe": "studies/probes/reduction.py (FPRev tree inference: studies/probes/trees.py)",
            "source": "tests/data/h100/results.json: probes.reduction.result.configs; random rows and GPU "
            "outputs in tests/data/h100/reduction.npz",
            "recording_command": "OUT=$OUT bash studies/device/run_probes.sh",
            "recorded": res["started"],
            "seed": red["result"]["seed"],
            "gpu": env["gpu_name"],
            "driver": driver,
            "cuda": env["torch_cuda"],
            "ptxas": ptxas,
            "torch": env["torch"],
            "triton": env["triton"],
            "built_by": "python -m tools.build_package_data",
        },
        "configs": configs,
    }


def dump_trees(data: dict) -> str:
    """Indented JSON with each tree on one compact line."""
    marked = json.loads(json.dumps(data))
    trees = {}
    for key, c in marked["configs"].items():
        trees[key] = c["tree"]
        c["tree"] = f"@@{key}@@"
    text = json.dumps(marked, indent=1)
    for key, tree in trees.items():
        text = text.replace(f'"@@{key}@@"', json.dumps(tree, separators=(",", ":")))
    return text + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "src",
        type=Path,
        metavar="FOLDER",
        help="a probe run's output folder (results.json, exp2.npz; rcp.npz from studies/device/run_verify.sh)",
    )
    args = ap.parse_args()
    if not any((args.src / f).is_file() for f in ("results.json", "results.json.gz")):
        ap.error(f"FOLDER {args.src} lacks results.json: give the output folder of studies/device/run_probes.sh")
    DST.mkdir(exist_ok=True)
    for name, arrays in (("ex2", build_ex2(args.src)), ("rcp", build_rcp(args.src))):
        if arrays is None:
            print(f"{name}: no recording in {args.src}, skipped")
            continue
        np.savez_compressed(DST / f"{name}.npz", **arrays)
        print(f"{name}: {(DST / f'{name}.npz').stat().st_size} bytes")
    trees = DST / "reduction_trees.json"
    trees.write_text(dump_trees(build_trees(args.src)))
    print(f"reduction_trees: {trees.stat().st_size} bytes")


if __name__ == "__main__":
    main()
