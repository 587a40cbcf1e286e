"""FlexAttention's short-query launches (fewer than 128 queries: Inductor's flex_decoding template, BLOCK_M 16, 64 or
128 on 2 warps, mma.sync), recorded with what its combine reads: each split's row max M, row sum L and unnormalised
accumulator, as the template kernel leaves them, then O and the LSE the combine kernels make of them.

    PYTHONPATH=. python -m studies.device.flex_short_tiles --out $OUT [--budget 130]

A query count below 128 sends flex_attention to Inductor's decoding template: a grid of (Q blocks, batch x KV heads,
SPLIT_KV) programs, each running the online softmax over its own range of keys and storing M, L and acc (FP32), and
Inductor's reductions after it (max of M over the splits, alpha = exp2(M - max), L and acc summed over the splits with
alpha, acc / L, log2 L + max).  Cases: four launches of tests/data/flex/flex_check.json (three with a document mask
at 100 keys, whose two 64-key splits the combine merges, and one without a mask), and new ones: a causal mask at 100
keys (two splits), no mask at 16 keys (a 16-row tile whose keys reach the second warp's columns) and at 48 keys with
head dim 128 (64 rows).  Each case is compiled afresh (`torch.compile(flex_attention, fullgraph=True,
dynamic=False)`, as `gpu.crosscheck.kernels.flex_attention` compiles it), run once to compile, then once more with
every Triton launch recorded: its kernel, its config and the bits of each floating-point tensor it was handed,
read back after it ran (the template's M, L and acc buffers; the combine's outputs).

Writes `short_tiles.json` (versions, SM count, per case the inputs (seed, kinds), the tiles, O's and the LSE's
SHA-256, whether they equal the recorded ones, each launch with its arguments, and the MMA layouts of the template's
TTGIR), `short_tiles.npz` (O, LSE and every recorded argument as bits; a case whose arguments would take the file
past 14 MiB keeps O and the LSE only, and says so) and `short_tiles_code.tar.gz` (Inductor's generated modules,
every kernel's TTGIR and PTX, and the SASS of its cubin by `cuobjdump -sass`).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir
from flashsim.recording import sha256_of
from gpu.commands import require_gpu

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "flex" / "flex_check.json"
SEED0 = 2_026_800_000  # fresh: no other recording draws from here
#: launches of flex_check.json (indices of `studies.device.flex_check.grid`): documents at 100 keys (d 64, 128, 64),
#: then no mask at 100 keys
RECORDED = (3, 51, 99, 35)
CAP = 14 << 20  # bytes a file may take


def cases() -> list[dict]:
    """The cases in the order they run (the most telling first, so that a run cut short keeps them)."""
    from studies.device.flex_check import grid

    old = grid()
    fresh = [
        {"n": 100, "heads": 32, "d": 64, "dtype": "fp16", "mask": "causal"},
        {"n": 16, "heads": 16, "d": 64, "dtype": "bf16", "mask": "none"},
        {"n": 48, "heads": 64, "d": 128, "dtype": "fp16", "mask": "none"},
    ]
    for i, c in enumerate(fresh):
        c |= {"seed": SEED0 + 100 * i, "first_kind": i}
    recorded = [dict(old[i], flex_check_index=i) for i in RECORDED]
    return [recorded[0], fresh[0], recorded[1], fresh[1], recorded[3], recorded[2], fresh[2]]


def _recorded_digests() -> dict[int, dict]:
    """flex_check.json's digests of O and the LSE by seed."""
    return {c["seed"]: c["digests"] for c in json.loads(DATA.read_text())["cases"]}


def _tensor_args(args: tuple, skip: set[int]) -> list[tuple[int, object]]:
    """(position, tensor) of the floating-point tensors among a launch's arguments, the inputs q, k, v left out."""
    import torch

    return [
        (i, a)
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.data_ptr() not in skip
    ]


def _record_launches(torch, skip: set[int]):
    """Patch Inductor's kernel runner so that every launch is recorded after it ran; returns (launches, restore)."""
    from torch._inductor.runtime import triton_heuristics

    from gpu.crosscheck.live import bits_of

    launches: list[dict] = []
    original = triton_heuristics.CachingAutotuner.run

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        torch.cuda.synchronize()
        cfg = self.launchers[0].config if len(self.launchers) == 1 else None
        launches.append(
            {
                "kernel": self.fn.__name__,
                "config": None if cfg is None else dict(cfg.kwargs) | {"num_warps": cfg.num_warps},
                "args": [
                    {"position": i, "shape": list(t.shape), "dtype": str(t.dtype)[6:], "bits": bits_of(t)}
                    for i, t in _tensor_args(args, skip)
                ],
            }
        )
        return out

    triton_heuristics.CachingAutotuner.run = recording

    def restore() -> None:
        triton_heuristics.CachingAutotuner.run = original

    return launches, restore


def _run_case(torch, case: dict) -> tuple[dict, dict[str, np.ndarray]]:
    """One case compiled afresh and run twice (the second run's launches recorded); its record and its bits."""
    from torch._inductor.utils import run_and_get_code
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from gpu.crosscheck.kernels import flex_config
    from gpu.crosscheck.live import bits_of, on_device
    from studies.device.flex_capture import case_inputs, document_ids, mask_mod

    torch._dynamo.reset()
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[case["dtype"]]
    x, _ = on_device({k: a for k, a in case_inputs(case).items() if k != "do"}, tdt, "cuda")
    n = case["n"]
    doc = torch.from_numpy(document_ids(n, case["seed"])).cuda()
    mod = mask_mod(case["mask"], doc)
    block_mask = None if mod is None else create_block_mask(mod, None, None, n, n, device="cuda")
    scale = 1.0 / math.sqrt(case["d"])  # as kernel_run passes it
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch before AuxRequest: return_lse
        AuxRequest = None

    def call():
        if AuxRequest is None:
            return compiled(x["q"], x["k"], x["v"], block_mask=block_mask, scale=scale, return_lse=True)
        o, aux = compiled(x["q"], x["k"], x["v"], block_mask=block_mask, scale=scale, return_aux=AuxRequest(lse=True))
        return o, aux.lse

    with torch.no_grad():
        (o1, lse1), sources = run_and_get_code(call)
        launches, restore = _record_launches(torch, {t.data_ptr() for t in x.values()})
        try:
            o, lse = call()
            torch.cuda.synchronize()
        finally:
            restore()
    bits = {"o": bits_of(o[0]), "lse": bits_of(lse[0].float().contiguous())}
    record = {
        "kernel_info": flex_config(sources),
        "kernels": sorted({m for s in sources for m in re.findall(r"def (triton_\w+)\(", s)}),
        "digests": {name: sha256_of(b) for name, b in bits.items()},
        "second_run_same": bool(
            np.array_equal(bits["o"], bits_of(o1[0])) and np.array_equal(bits["lse"], bits_of(lse1[0].float()))
        ),
        "launches": [],
    }
    seen: dict[str, str] = {}
    for j, launch in enumerate(launches):
        entry = {"kernel": launch["kernel"], "config": launch["config"], "args": []}
        for arg in launch["args"]:
            digest = hashlib.sha256(arg["bits"].tobytes()).hexdigest()
            key = seen.setdefault(digest, f"launch{j}/arg{arg['position']}")
            if key == f"launch{j}/arg{arg['position']}":
                bits[key] = arg["bits"]
            entry["args"].append({k: arg[k] for k in ("position", "shape", "dtype")} | {"key": key, "sha256": digest})
        record["launches"].append(entry)
    return record, bits


def _save(out: Path, arrays: dict[str, np.ndarray]) -> int:
    np.savez_compressed(out / "short_tiles.npz", **arrays)
    return (out / "short_tiles.npz").stat().st_size


def _mma_layouts(root: Path) -> dict[str, list[str]]:
    """The MMA encodings (warpsPerCTA, instrShape) each kernel's TTGIR declares, by file (kernels without one left
    out)."""
    found = {}
    for path in sorted(root.rglob("*.ttgir")):
        layouts = sorted(set(re.findall(r"#\w+ = #ttg\.nvidia_mma<[^>]*>", path.read_text(errors="replace"))))
        if layouts:
            found[f"{path.parent.name}/{path.name}"] = layouts
    return found


def _code_archive(out: Path, roots: list[Path]) -> int:
    """Inductor's generated modules, every kernel's TTGIR and PTX, and its SASS, as far as CAP allows."""
    buf, kept = io.BytesIO(), 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for root in roots:
            for path in sorted(root.rglob("*")):
                if not path.is_file() or path.stat().st_size > 4 << 20:
                    continue
                name = f"{path.parent.name}/{path.name}"
                if path.suffix == ".py" and "triton" in path.read_text(errors="replace"):
                    tar.add(path, arcname=f"inductor/{name}")
                elif path.suffix in (".ttgir", ".ptx"):
                    tar.add(path, arcname=f"kernels/{name}")
                elif path.suffix == ".cubin":
                    sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True)
                    data = sass.stdout.encode()
                    info = tarfile.TarInfo(f"kernels/{name}.sass")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    continue
                kept += 1
    if buf.tell() > CAP:
        raise RuntimeError(f"the code archive takes {buf.tell()} bytes, past {CAP}")
    (out / "short_tiles_code.tar.gz").write_bytes(buf.getvalue())
    return kept


def run(args) -> int:
    out = writable_dir(args.out, "--out")
    cache = Path(tempfile.mkdtemp(prefix="flex_short_"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    require_gpu("python -m studies.device.flex_short_tiles")
    import torch
    import triton

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    props = torch.cuda.get_device_properties(0)
    meta = {
        "command": "PYTHONPATH=. python -m studies.device.flex_short_tiles --out $OUT",
        "device": props.name,
        "sm_count": int(props.multi_processor_count),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "cases": [],
    }
    recorded = _recorded_digests()
    arrays: dict[str, np.ndarray] = {}
    t0 = time.monotonic()
    for i, case in enumerate(cases()):
        if time.monotonic() - t0 > args.budget:
            break
        t1 = time.monotonic()
        try:
            record, bits = _run_case(torch, case)
        except Exception as exc:  # noqa: BLE001 - a failed case is a result
            meta["cases"].append(case | {"error": f"{type(exc).__name__}: {exc}"[:2000]})
            print(f"case {i}: {meta['cases'][-1]['error'][:300]}", flush=True)
            continue
        if "flex_check_index" in case:
            record["same_as_flex_check"] = record["digests"] == recorded[case["seed"]]
        kept = dict(arrays) | {f"case{i}/{k}": v for k, v in bits.items()}
        if _save(out, kept) > CAP:
            record["args_left_out"] = True
            kept = dict(arrays) | {f"case{i}/{k}": bits[k] for k in ("o", "lse")}
            _save(out, kept)
        arrays = kept
        record["seconds"] = round(time.monotonic() - t1, 1)
        meta["cases"].append(case | record)
        (out / "short_tiles.json").write_text(json.dumps(meta, indent=1))
        print(
            f"case {i} ({case['mask']} n {case['n']} h {case['heads']} d {case['d']} {case['dtype']}): "
            f"{record['kernel_info']} {len(record['launches'])} launches, {record['seconds']} s"
            + (f", as recorded: {record['same_as_flex_check']}" if "same_as_flex_check" in record else ""),
            flush=True,
        )
    meta["mma_layouts"] = _mma_layouts(cache)
    meta["code_files"] = _code_archive(out, [cache])
    meta["seconds"] = round(time.monotonic() - t0, 1)
    (out / "short_tiles.json").write_text(json.dumps(meta, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.flex_short_tiles", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--budget", type=float, default=130.0, help="seconds after which no new case starts")
    args = ap.parse_args(argv)
    return run_command("flex_short_tiles", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
