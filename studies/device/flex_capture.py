"""PyTorch's FlexAttention compiled as users compile it, recorded with the code that ran: outputs' bits, the
generated Triton source, its PTX and SASS.

    PYTHONPATH=. python -m studies.device.flex_capture --out $OUT [--budget 420]

`torch.compile(flex_attention, fullgraph=True, dynamic=False)` with the recompile limit raised (a new shape or
mask recompiles; none falls back to eager: fullgraph raises on a graph break and the limit is never reached),
on masks none, causal, sliding window and document, lengths a multiple of the tile and not, head dims 64 and
128, bf16 and fp16, inputs of every kind from fresh seeds.  Forward (O and the natural-log LSE flex returns) and
backward (dQ, dK, dV of O's gradient dO).  Writes `flex.json` (cases, launches, versions),
`flex_fwd.npz`, `flex_bwd_<dtype>.npz` (the outputs' bits) and `flex_code.tar.gz` (Inductor's generated
modules, and each template kernel's PTX and `cuobjdump -sass`).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir
from flashsim.recording import sha256_of
from gpu.commands import require_gpu

SEED0 = 2_026_400_000  # fresh: no other recording draws from here
MASKS = ("none", "causal", "sliding", "document")
WINDOW = 160  # keys a query sees under the sliding window (itself and the 159 before it)


def grid() -> list[dict]:
    """Every dtype x head dim x mask x length (1024: a whole number of tiles; 200: not), the varied ones first so
    that a run cut short by its budget still covers each kind of launch; 3 heads at 200 keys, 1 at 1024."""
    cases = []
    for n in (1024, 200):
        for mask in MASKS:
            for d in (64, 128):
                for dtype in ("bf16", "fp16"):
                    i = len(cases)
                    cases.append(
                        {
                            "n": n,
                            "heads": 3 if n == 200 else 1,
                            "d": d,
                            "dtype": dtype,
                            "mask": mask,
                            "seed": SEED0 + 100 * i,
                            "first_kind": i,
                        }
                    )
    return cases


def case_inputs(case: dict) -> dict[str, np.ndarray]:
    """q, k, v, do of the case as (heads, n, d) float32 arrays of dtype values."""
    from flashsim.inputs import case_kinds, make_heads

    return make_heads(case_kinds(case), case["heads"], case["n"], case["n"], case["d"], case["dtype"], case["seed"])


def document_ids(n: int, seed: int) -> np.ndarray:
    """Each position's document: 2 to 5 documents of random lengths (fewer where n is smaller)."""
    rng = np.random.default_rng(seed)
    count = min(int(rng.integers(1, 5)), n - 1)
    cuts = np.sort(rng.choice(np.arange(1, n), size=max(count, 0), replace=False))
    return np.searchsorted(cuts, np.arange(n), side="right").astype(np.int64)


def mask_matrix(case: dict) -> np.ndarray | None:
    """The case's mask as flashsim takes it (`KernelRun.mask`): a boolean (n, n) matrix, True where a query
    attends a key; None for no mask and for causal (a KernelRun's ``causal``)."""
    n = case["n"]
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    if case["mask"] == "sliding":
        return (q >= k) & (q - k < WINDOW)
    if case["mask"] == "document":
        doc = document_ids(n, case["seed"])
        return doc[q] == doc[k]
    return None


def mask_mod(name: str, doc):
    """The case's mask as a FlexAttention mask_mod (None: no mask)."""
    if name == "none":
        return None
    if name == "causal":
        return lambda b, h, q, kv: q >= kv
    if name == "sliding":
        return lambda b, h, q, kv: (q >= kv) & (q - kv < WINDOW)
    return lambda b, h, q, kv: doc[q] == doc[kv]


def _compiled():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    torch._dynamo.config.automatic_dynamic_shapes = False
    return torch.compile(flex_attention, fullgraph=True, dynamic=False)


def _run_case(flex, case: dict, device: str = "cuda") -> tuple[dict, dict[str, np.ndarray]]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from gpu.crosscheck.live import bits_of

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[case["dtype"]]
    x = {n: torch.from_numpy(a).to(tdt).to(device)[None] for n, a in case_inputs(case).items()}
    doc = torch.from_numpy(document_ids(case["n"], case["seed"])).to(device)
    mod = mask_mod(case["mask"], doc)
    n = case["n"]
    block_mask = None if mod is None else create_block_mask(mod, None, None, n, n, device=device)
    q, k, v = (x[name].detach().clone().requires_grad_() for name in "qkv")
    try:
        from torch.nn.attention.flex_attention import AuxRequest

        o, aux = flex(q, k, v, block_mask=block_mask, return_aux=AuxRequest(lse=True))
        lse = aux.lse
    except (ImportError, TypeError):
        o, lse = flex(q, k, v, block_mask=block_mask, return_lse=True)
    o.backward(x["do"])
    out = {"o": bits_of(o.detach()[0]), "lse": bits_of(lse.detach()[0].float().contiguous())}
    out |= {g: bits_of(t.grad[0]) for g, t in (("dq", q), ("dk", k), ("dv", v))}
    info = {"block_mask": None if block_mask is None else repr(block_mask)[:2000]}
    if block_mask is not None:
        bm = block_mask
        info["block_size"] = list(getattr(bm, "BLOCK_SIZE", ()))
        info["kv_num_blocks"] = bm.kv_num_blocks[0, 0].cpu().tolist()
        info["kv_indices"] = bm.kv_indices[0, 0].cpu().tolist()
        if bm.full_kv_num_blocks is not None:
            info["full_kv_num_blocks"] = bm.full_kv_num_blocks[0, 0].cpu().tolist()
            info["full_kv_indices"] = bm.full_kv_indices[0, 0].cpu().tolist()
    return info, out


def _code_archive(out: Path, roots: list[Path]) -> int:
    """Inductor's generated modules (wrappers and kernels), and the template kernels' PTX and SASS."""
    kept = 0
    with tarfile.open(out / "flex_code.tar.gz", "w:gz") as tar:
        for root in roots:
            for path in sorted(root.rglob("*")):
                if not path.is_file():
                    continue
                if path.suffix == ".py" and "triton" in path.read_text(errors="replace"):
                    tar.add(path, arcname=f"inductor/{path.parent.name}_{path.name}")
                    kept += 1
                elif path.suffix == ".ptx" and "triton_tem" in path.name:
                    tar.add(path, arcname=f"kernels/{path.parent.name}_{path.name}")
                    cubin = path.with_suffix(".cubin")
                    if cubin.is_file():
                        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True)
                        data = sass.stdout.encode()
                        info = tarfile.TarInfo(f"kernels/{path.parent.name}_{cubin.stem}.sass")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
                    kept += 1
    return kept


def run(args) -> int:
    out = writable_dir(args.out, "--out")
    cache = Path(tempfile.mkdtemp(prefix="flex_inductor_"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
    require_gpu("python -m studies.device.flex_capture")
    import torch
    import triton

    flex = _compiled()
    props = torch.cuda.get_device_properties(0)
    meta = {
        "command": "PYTHONPATH=. python -m studies.device.flex_capture --out $OUT",
        "device": props.name,
        "sm_count": int(props.multi_processor_count),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "window": WINDOW,
        "cases": [],
    }
    arrays: dict[str, dict[str, np.ndarray]] = {"fwd": {}, "bwd_bf16": {}, "bwd_fp16": {}}
    t0 = time.monotonic()
    for i, case in enumerate(grid()):
        if time.monotonic() - t0 > args.budget:
            break
        t1 = time.monotonic()
        try:
            info, bits = _run_case(flex, case)
        except Exception as exc:  # noqa: BLE001 - a refused launch is a result
            case["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            meta["cases"].append(case)
            print(f"case {i}: {case['error'][:300]}", flush=True)
            continue
        case |= info
        case["digests"] = {name: sha256_of(b) for name, b in bits.items()}
        case["seconds"] = round(time.monotonic() - t1, 1)
        meta["cases"].append(case)
        for name in ("o", "lse"):
            arrays["fwd"][f"case{i}/{name}"] = bits[name]
        for name in ("dq", "dk", "dv"):
            arrays[f"bwd_{case['dtype']}"][f"case{i}/{name}"] = bits[name]
        print(f"case {i} ({case['mask']} n {case['n']} d {case['d']} {case['dtype']}): {case['seconds']} s", flush=True)
        for stem, kept in arrays.items():
            if kept:
                np.savez_compressed(out / f"flex_{stem}.npz", **kept)
        (out / "flex.json").write_text(json.dumps(meta, indent=1))
    meta["code_files"] = _code_archive(out, [cache])
    meta["seconds"] = round(time.monotonic() - t0, 1)
    (out / "flex.json").write_text(json.dumps(meta, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.flex_capture", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds after which no new case starts")
    args = ap.parse_args(argv)
    return run_command("flex_capture", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
