"""Sweeps with rows on the GPU (`flashsim sweep --engine gpu`), on a GPU machine: bit-equality and throughput.

1. **Equal**: small sweeps over every kind of launch the gpu engine runs (our Triton kernels in bf16 at head
   dims 64 and 128 with every variant gpu.flash accepts, fp16, the FP8 kernel on e4m3fn inputs, SDPA's flash,
   memory-efficient and cuDNN backends) plus cells the engine leaves to the emulator, each computed with
   `--engine cpu` and `--engine gpu`; every per-row column must be bit-equal.  A kind whose GPU sweep
   stops on a confirmation mismatch is reported and left out of step 2.
2. **Big**: the same launches over many rows on the GPU, every task confirming 8 rows of each cell on the
   emulator; then the CPU engine over the first rows of the same cells on the same machine, its results
   compared with the GPU's rows and its rate (cell-rows per second) with the GPU's.
3. **Slots** (time permitting): one big sweep again with no limit and with one GPU task at a time, beside the
   default of two (`gpu.sweep_engine.GpuEngine.local_slots`), with the GPU memory each peaked at.

All sweeps share one local Dask cluster (one process per core, one thread each) started once, so the rates
are of warm workers; the emulator's and Triton's compiled code is made once in this process first.  Writes
`sweep_gpu.json` into `--out`.  Needs torch, Triton, a CUDA GPU, dask.distributed and pyarrow::

    OUT=$OUT bash studies/device/run_module.sh studies.device.sweep_gpu [--workers 16] [--big-rows 30000]
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from gpu.commands import require_gpu

PROG = "python -m studies.device.sweep_gpu"
KERNEL = "gpu.policies:kernel_policy"
SDPA = [
    {
        "target": "gpu.policies:sdpa_flash_policy",
        "kwargs": {"head_dim": 64, "n_q": 1, "n_k": 128, "batch_heads": 10000},
    },
    {"target": "gpu.policies:sdpa_efficient_policy", "kwargs": {"head_dim": 64}},
]
FAMILIES = [{"name": "ties", "label": "ties 2-8", "ties": [2, 3, 4, 5, 6, 7, 8]}, {"name": "dense"}, {"name": "single"}]
COLUMNS = ("row", "o_err", "delta_err", "ties", "o_ulp", "delta_ulp")


def _kernel(dtype: str, head_dim: int = 64) -> dict:
    return {"target": KERNEL, "kwargs": {"dtype": dtype, "head_dim": head_dim, "causal": False}}


def kinds(variants: list[str]) -> dict[str, dict]:
    """Each kind of launch as the axes of a spec (rows, chunks and families are added per step)."""
    return {
        "ours_bf16": {"policies": ["gpu.policies:TRITON_H100"], "softmaxes": variants},
        "ours_fp16": {"policies": [_kernel("fp16")], "softmaxes": variants, "formats": ["fp16"]},
        "ours_fp8": {"policies": [_kernel("e4m3")], "softmaxes": variants, "formats": ["e4m3fn"]},
        **{
            f"{p['target'].split(':')[1].removesuffix('_policy')}": {"policies": [p], "softmaxes": ["standard"]}
            for p in SDPA
        },
    }


def small_specs(variants: list[str], rows: int) -> dict[str, dict]:
    """Step 1: each kind on two families, plus cells the emulator keeps (qiu_yao; dithered), and our kernel at
    head dim 128 with 1024 keys (the overlap kernel's length)."""
    specs = {}
    for name, axes in kinds(variants).items():
        axes = dict(axes)
        if name == "ours_bf16":  # the control: cells the engine leaves to the emulator, in the same tasks
            axes["policies"] = [*axes["policies"], "qiu_yao"]
            axes["softmaxes"] = [*axes["softmaxes"], "dithered"]
        specs[name] = {**axes, "rows": rows, "chunk_rows": rows // 2, "families": FAMILIES[:2]}
    specs["ours_bf16_d128"] = {
        "policies": [_kernel("bf16", 128)],
        "softmaxes": variants[:2],
        "head_dim": [128],
        "n_keys": [1024],
        "rows": max(rows // 4, 16),
        "chunk_rows": max(rows // 8, 8),
        "families": FAMILIES[:1],
    }
    return specs


def _spec(name: str, axes: dict):
    from flashsim.sweep import parse_spec

    return parse_spec({"name": name, "seeds": [1], **axes}, f"{name}.toml")


class MemoryPeak:
    """The GPU's used memory (all processes: total - free) sampled every 50 ms while inside the block."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()

    def _poll(self):
        import torch

        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _sweep(spec, out: Path, engine, client, confirm: int = 8) -> dict:
    """One sweep into a fresh folder: its result, time and the GPU memory peak."""
    from flashsim.sweep.run import run_sweep

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    with MemoryPeak() as mem:
        res = run_sweep(spec, out, engine=engine, confirm=confirm, client=client, quiet=True)
    return {
        "engine": engine.name,
        "local_slots": getattr(engine, "local_slots", None),
        "cells": res.n_cells,
        "cell_rows": res.cell_rows,
        "seconds": round(res.seconds, 3),
        "wall_seconds": round(time.perf_counter() - t0, 3),
        "cell_rows_per_s": round(res.rows_per_second, 1),
        "gpu_memory_peak_gib": round(mem.peak / 2**30, 2),
    }


def _table(out: Path):
    from flashsim.sweep import read_results

    return read_results(out).sort_by([("cell", "ascending"), ("row", "ascending")])


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint64) if a.dtype == np.float64 else a


def compare(cpu, gpu, key=("cell",), first_rows: int | None = None) -> dict:
    """Per-row columns of two results bit for bit, matched by `key` and row (`first_rows`: only the rows of
    `gpu` below it); and which engine computed how many rows of `gpu`, how many confirmed."""
    import pyarrow.compute as pc

    if first_rows is not None:
        gpu = gpu.filter(pc.less(gpu["row"], first_rows))
    cpu, gpu = (t.sort_by([*((k, "ascending") for k in key), ("row", "ascending")]) for t in (cpu, gpu))
    same = cpu.num_rows == gpu.num_rows
    differing = {}
    if same:
        for name in (*key, *COLUMNS):
            a, b = (np.asarray(t[name].to_pylist() if name in key else t[name].to_numpy()) for t in (cpu, gpu))
            bad = int(np.count_nonzero(_bits(a) != _bits(b)))
            if bad:
                differing[name] = bad
    engine = np.asarray(gpu["engine"].to_pylist())
    names, counts = np.unique(engine, return_counts=True)
    return {
        "rows": gpu.num_rows,
        "bit_equal": same and not differing,
        "row_counts_match": same,
        "differing_rows_by_column": differing,
        "rows_by_engine": {str(n): int(c) for n, c in zip(names, counts, strict=True)},
        "confirmed_rows": int(np.count_nonzero(gpu["confirmed"].to_numpy(zero_copy_only=False))),
    }


def _save(out: Path, report: dict) -> None:
    """The report so far (a run cut short still leaves what it found)."""
    (out / "sweep_gpu.json").write_text(json.dumps(report, indent=1) + "\n")


def warm(specs: dict, engine) -> dict:
    """Compile the emulator's kernels (Numba caches them on disk for the workers) and the GPU kernels (Triton's
    cache) for every cell of `specs` on two rows, in this process; seconds each."""
    import numba

    from flashsim.sweep.engines import EMULATOR
    from flashsim.sweep.work import Task, compute_task, make_inputs

    t0 = time.perf_counter()
    threads = numba.get_num_threads()
    for name, axes in specs.items():
        spec = _spec(name, {**axes, "rows": 2, "chunk_rows": 2})
        for group in spec.groups():
            compute_task(Task(group, 0, 2, tuple(spec.cells(group)), EMULATOR))
    numba.set_num_threads(threads)
    t1 = time.perf_counter()
    for name, axes in specs.items():
        spec = _spec(name, {**axes, "rows": 2, "chunk_rows": 2})
        for group in spec.groups():
            cells = [c for c in spec.cells(group) if engine.why_not(c) is None]
            if cells:
                engine.compute_o(make_inputs(group, 0, 2), cells)
    return {"emulator_s": round(t1 - t0, 1), "gpu_s": round(time.perf_counter() - t1, 1)}


def run(out: Path, workers: int, small_rows: int, big_rows: int, cpu_rows: int, seconds: float, engine=None) -> int:
    """Steps 1-3 (`engine`: the gpu engine, by default `gpu.sweep_engine.GpuEngine`)."""
    import torch
    from distributed import Client, LocalCluster

    from flashsim.sweep.engines import EMULATOR
    from flashsim.sweep.run import MismatchError
    from gpu import flash
    from gpu.sweep_engine import GpuEngine, plan_cell

    start = time.perf_counter()
    gpu_engine = engine or GpuEngine()
    variants = [v for v in ("standard", "stabilised", "robust", "cast_sum") if v in flash.SOFTMAX_IDS]
    props = torch.cuda.get_device_properties(0)
    report: dict = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "cpu_cores": os.cpu_count(),
        "workers": workers,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "variants_on_gpu": variants,
    }
    small = small_specs(variants, small_rows)
    report["warm"] = warm(small, gpu_engine)
    print(f"warm: {report['warm']}", flush=True)
    scratch = out / "sweeps"
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        preload=["flashsim.sweep.quiet_worker"],
    )
    client = Client(cluster)
    try:
        # 1. both ways, bit for bit
        report["equal"] = {}
        passed = []
        for name, axes in small.items():
            spec = _spec(name, axes)
            routed = {c.id: gpu_engine.why_not(c) for c in spec.cells()}
            entry: dict = {
                "cells": len(routed),
                "cells_on_gpu": sum(v is None for v in routed.values()),
                "on_the_emulator": sorted({v for v in routed.values() if v}),
                "plans": sorted({str(plan_cell(c)) for c in spec.cells() if routed[c.id] is None}),
            }
            entry["cpu"] = _sweep(spec, scratch / f"{name}_cpu", EMULATOR, client)
            try:
                entry["gpu"] = _sweep(spec, scratch / f"{name}_gpu", gpu_engine, client)
            except MismatchError as exc:
                entry["mismatch"] = str(exc)
            else:
                entry.update(compare(_table(scratch / f"{name}_cpu"), _table(scratch / f"{name}_gpu")))
                entry["routed_as_planned"] = entry["rows_by_engine"].get("gpu", 0) == entry["cells_on_gpu"] * spec.rows
                if (
                    entry["bit_equal"]
                    and entry["routed_as_planned"]
                    and entry["cells_on_gpu"]
                    and name in kinds(variants)
                ):
                    passed.append(name)
            report["equal"][name] = entry
            _save(out, report)
            print(f"equal {name}: {json.dumps({k: v for k, v in entry.items() if k != 'on_the_emulator'})}", flush=True)
        # 2. big on the GPU, then the CPU engine over the first rows of the same cells
        report["big"] = {}
        keys = ("policy", "softmax", "family", "format", "n_keys", "block_n", "head_dim", "seed")
        for name in passed:
            if time.perf_counter() - start > seconds:
                report["big"][name] = "skipped: out of time"
                continue
            axes = {**kinds(variants)[name], "families": FAMILIES}
            big = _spec(f"{name}_big", {**axes, "rows": big_rows, "chunk_rows": max(big_rows // 12, 1)})
            entry = {"gpu": _sweep(big, scratch / f"{name}_big", gpu_engine, client)}
            few = _spec(f"{name}_cpu", {**axes, "rows": cpu_rows, "chunk_rows": max(cpu_rows // 8, 1)})
            entry["cpu"] = _sweep(few, scratch / f"{name}_cpu_rows", EMULATOR, client)
            entry["speedup"] = round(entry["gpu"]["cell_rows_per_s"] / entry["cpu"]["cell_rows_per_s"], 2)
            both = compare(_table(scratch / f"{name}_cpu_rows"), _table(scratch / f"{name}_big"), keys, cpu_rows)
            entry["first_rows_equal_cpu"] = both["bit_equal"]
            entry["differing_rows_by_column"] = both["differing_rows_by_column"]
            entry["confirmed_rows"] = int(np.count_nonzero(_table(scratch / f"{name}_big")["confirmed"].to_numpy()))
            shutil.rmtree(scratch / f"{name}_big", ignore_errors=True)
            report["big"][name] = entry
            _save(out, report)
            print(f"big {name}: {json.dumps(entry)}", flush=True)
        totals = [e for e in report["big"].values() if isinstance(e, dict)]
        if totals:
            g = sum(e["gpu"]["cell_rows"] for e in totals), sum(e["gpu"]["seconds"] for e in totals)
            c = sum(e["cpu"]["cell_rows"] for e in totals), sum(e["cpu"]["seconds"] for e in totals)
            report["big_total"] = {
                "gpu_cell_rows": g[0],
                "gpu_cell_rows_per_s": round(g[0] / g[1], 1),
                "cpu_cell_rows": c[0],
                "cpu_cell_rows_per_s": round(c[0] / c[1], 1),
            }
        # 3. how many GPU tasks at once
        report["slots"] = {}
        if passed:
            name = passed[0]
            axes = {**kinds(variants)[name], "families": FAMILIES}
            big = _spec(f"{name}_slots", {**axes, "rows": big_rows, "chunk_rows": max(big_rows // 12, 1)})
            for slots in (None, 1):
                if time.perf_counter() - start > seconds:
                    report["slots"][str(slots)] = "skipped: out of time"
                    continue
                got = _sweep(big, scratch / f"{name}_slots", replace(gpu_engine, local_slots=slots), client)
                report["slots"][str(slots)] = got
                print(f"slots {slots}: {json.dumps(got)}", flush=True)
    finally:
        client.close()
        cluster.close()
        shutil.rmtree(scratch, ignore_errors=True)
    report["seconds"] = round(time.perf_counter() - start, 1)
    _save(out, report)
    failed = [n for n, e in report["equal"].items() if not (e.get("bit_equal") and e.get("routed_as_planned"))]
    big_bad = [n for n, e in report["big"].items() if isinstance(e, dict) and not e["first_rows_equal_cpu"]]
    print(f"written {out / 'sweep_gpu.json'}; {report['seconds']} s")
    if failed or big_bad:
        print(f"NOT EQUAL: {failed + big_bad}")
        return 1
    print("every GPU sweep equal to the CPU's bit for bit")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for sweep_gpu.json")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="local cluster processes (default: cores)")
    ap.add_argument("--small-rows", type=int, default=600, help="rows per cell of step 1 (default 600)")
    ap.add_argument("--big-rows", type=int, default=30000, help="rows per cell of step 2 on the GPU (default 30000)")
    ap.add_argument("--cpu-rows", type=int, default=2000, help="rows per cell of step 2 on the CPU (default 2000)")
    ap.add_argument(
        "--seconds", type=float, default=300.0, help="skip step 2's later kinds and step 3 past this (default 300)"
    )
    args = ap.parse_args(argv)

    def go() -> int:
        out = writable_dir(args.out, "--out")
        require_gpu(PROG)
        for mod, what in (("distributed", "dask.distributed"), ("pyarrow", "pyarrow")):
            if importlib.util.find_spec(mod) is None:
                raise UsageError(f"needs {what} (pip install 'lowprec-attention[sweep]', or its wheels)")
        for flag in ("workers", "small_rows", "big_rows", "cpu_rows"):
            if getattr(args, flag) < (16 if flag != "workers" else 1):
                raise UsageError(f"--{flag.replace('_', '-')}: expected at least {16 if flag != 'workers' else 1}")
        if args.cpu_rows > args.big_rows:
            raise UsageError("--cpu-rows: expected at most --big-rows (its rows are compared with the GPU's)")
        with contextlib.suppress(AttributeError):
            import torch

            torch.set_num_threads(1)
        return run(out, args.workers, args.small_rows, args.big_rows, args.cpu_rows, args.seconds)

    return run_command(PROG, go)


if __name__ == "__main__":
    raise SystemExit(main())
