"""GPU work of the attention kernels in one call: smoke test, tile search, accuracy, recorded cases (bf16,
fp16, FP8, the cast_sum softmax, FP8 with P V promoted to FP32) for the emulator, and a short training check
(throughput: benchmarks/bench_gpu.py).

    OUT=/path bash studies/device/run_attention.sh --sections smoke,configs,log2 [--seconds 540]

Writes `$OUT/attention.json` (everything measured, with versions), `$OUT/attention_cases.npz`
(recorded cases: outputs as bits) and `$OUT/log2.npz`; `--sections cast_sum` (or `promote_pv`) records its cases
and checks them against the emulator on the spot.  Sections stop early when `--seconds` runs out and say so in
the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
import warnings
from pathlib import Path

import numpy as np

try:
    import torch
    import triton
    import triton.language as tl
    from triton.testing import do_bench
except ImportError as exc:  # one line when run, an ImportError when imported, without the gpu extra
    from gpu.commands import missing_extra

    raise missing_extra("studies.device.run_attention", __name__, exc) from None

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from gpu import flash
from gpu.commands import positive, require_gpu, sections
from gpu.configs import fwd_config
from gpu.crosscheck.cases import (
    Case,
    backward_cases,
    batch,
    cast_sum_backward_cases,
    cast_sum_cases,
    forward_cases,
    fp8_cases,
    inputs,
    promote_pv_cases,
)
from gpu.crosscheck.live import bits_of, same_bits
from gpu.kernels.steps import log2_fma

DT = flash.TORCH_DTYPES


def env() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def env_line(e: dict) -> str:
    """The GPU and library versions of `env`, for a benchmark's header."""
    return f"{e['gpu']}, torch {e['torch']}, Triton {e['triton']}, cuDNN {e['cudnn']}"


def cuda_graph(fn, reps: int = 1) -> torch.cuda.CUDAGraph:
    """`reps` calls of fn captured in one CUDA graph (fn run once outside it first, on a side stream as
    capture requires: compilation, caches), for timing without host time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def reference(q, k, v, causal: bool, scale: float, do=None):
    """FP64 attention (and gradients) on the GPU."""
    q64, k64, v64 = (x.double().requires_grad_(do is not None) for x in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) * scale
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, device=s.device, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v64
    lse = torch.logsumexp(s, -1)
    if do is None:
        return o.detach(), lse.detach(), None
    o.backward(do.double())
    return o.detach(), lse.detach(), (q64.grad, k64.grad, v64.grad)


def rand(shape, dtype):
    """Large N(0, 1) inputs drawn on the GPU, for timing."""
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(shape, device="cuda", generator=g).to(dtype) for _ in range(3))


def kind_inputs(kind: str, dtype: str, shape, seed: int):
    """q, k, v, dO of an input kind (gpu/crosscheck/cases.py), on the GPU."""
    return tuple(torch.from_numpy(a).cuda().to(DT[dtype]) for a in batch(kind, dtype, shape, seed).values())


# ---- sections -----------------------------------------------------------------------------------------
def smoke(res: dict, deadline: float) -> None:
    out = []
    for dtype in ("bf16", "fp16"):
        for d in (64, 128):
            for causal in (False, True):
                for sm in flash.SOFTMAX_IDS:
                    q, k, v, do = kind_inputs("repeated" if sm != "standard" else "random", dtype, (1, 2, 333, d), d)
                    o, lse, _ = flash.forward(q, k, v, causal=causal, softmax=sm)
                    dq, dk, dv, _ = flash.backward(q, k, v, o, lse, do, causal=causal)
                    o64, lse64, g64 = reference(q, k, v, causal, 1 / math.sqrt(d), do)
                    errs = {
                        "o": (o.double() - o64).abs().max().item(),
                        "lse": (lse.double() * math.log(2) - lse64).abs().max().item(),
                        **{
                            f"d{n}": (a.double() - b).abs().max().item()
                            for n, a, b in zip("qkv", (dq, dk, dv), g64, strict=True)
                        },
                    }
                    out.append({"dtype": dtype, "d": d, "causal": causal, "softmax": sm, "max_abs_err": errs})
    asm = attn_asm()
    res["smoke"] = {
        "cases": out,
        "fwd_ptx_has_wgmma": "wgmma" in asm.get("ptx", ""),
        "fwd_ptx_fma_count": asm.get("ptx", "").count("fma.rn.f32"),
        "fwd_sass_lines": asm.get("n_sass"),
    }
    worst = max(max(c["max_abs_err"].values()) for c in out)
    print(
        f"smoke: {len(out)} configs, worst abs error vs fp64 {worst:.3g}, wgmma in PTX: "
        f"{res['smoke']['fwd_ptx_has_wgmma']}",
        flush=True,
    )


def attn_asm() -> dict:
    """PTX of the compiled forward (bf16, d 64): is the dot wgmma, where are the FMAs."""
    try:
        cache = flash.attn_fwd.device_caches[0][0]
        kern = next(iter(cache.values()))
        return {"ptx": kern.asm.get("ptx", ""), "n_sass": len(kern.asm.get("sass", "").splitlines())}
    except Exception as exc:  # noqa: BLE001 - the cache layout differs across Triton versions
        return {"error": repr(exc)}


def fwd_flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def bench_one(fn, *args, **kwargs) -> float:
    """Milliseconds per call of fn(*args, **kwargs): the median over ~100 ms of calls (triton.testing.do_bench;
    not its default, the mean, which lets single slow calls move the short rows at N=1024)."""
    return do_bench(lambda: fn(*args, **kwargs), warmup=25, rep=100, return_mode="median")


def configs(res: dict, deadline: float) -> None:
    """Forward and backward tiles at N=4096 (B=4, H=32), bf16, non-causal and causal."""
    rows = []
    fwd = [
        flash.Config(128, 64, 4, 3),
        flash.Config(128, 128, 8, 3),
        flash.Config(128, 64, 8, 3),
        flash.Config(128, 128, 4, 3),
        flash.Config(64, 64, 4, 3),
        flash.Config(128, 64, 4, 4),
        flash.Config(128, 128, 8, 4),
        flash.Config(64, 128, 4, 3),
    ]
    bwd = [
        flash.Config(64, 64, 4, 3),
        flash.Config(64, 128, 8, 3),
        flash.Config(128, 128, 8, 2),
        flash.Config(64, 64, 4, 2),
        flash.Config(128, 64, 8, 2),
        flash.Config(64, 128, 4, 2),
    ]
    for d in (64, 128):
        q, k, v = rand((4, 32, 4096, d), torch.bfloat16)
        do = torch.randn_like(q)
        for causal in (False, True):
            for cfg in fwd:
                if time.time() > deadline:
                    res["configs_stopped"] = "time"
                    break
                try:
                    ms = bench_one(flash.forward, q, k, v, causal=causal, config=cfg)
                    tf = fwd_flops(4, 32, 4096, d, causal) / ms / 1e9
                except Exception as exc:  # noqa: BLE001 - a config can run out of shared memory
                    ms, tf = None, repr(exc)[:200]
                rows.append({"pass": "fwd", "d": d, "causal": causal, "config": cfg.__dict__, "ms": ms, "tflops": tf})
                print("config fwd", d, causal, cfg, tf, flush=True)
            o, lse, _ = flash.forward(q, k, v, causal=causal)
            for cfg in bwd:
                if time.time() > deadline:
                    break
                try:
                    ms = bench_one(flash.backward, q, k, v, o, lse, do, causal=causal, config=cfg)
                    tf = 2.5 * fwd_flops(4, 32, 4096, d, causal) / ms / 1e9
                except Exception as exc:  # noqa: BLE001
                    ms, tf = None, repr(exc)[:200]
                rows.append({"pass": "bwd", "d": d, "causal": causal, "config": cfg.__dict__, "ms": ms, "tflops": tf})
                print("config bwd", d, causal, cfg, tf, flush=True)
    res["configs"] = rows


@triton.jit
def _log2_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N, other=1.0)
    tl.store(Y + offs, log2_fma(x), mask=offs < N)


def log2(res: dict, out: Path) -> None:
    rng = np.random.default_rng(7)
    bits = np.concatenate(
        [
            rng.integers(0, 0x7F800000, 1 << 18, dtype=np.uint32),  # all positive finite
            rng.integers(0x3F000000, 0x40000000, 1 << 17, dtype=np.uint32),  # [0.5, 2)
            np.arange(0x3F7FF000, 0x3F801000, dtype=np.uint32),  # around 1
            np.arange(0, 4096, dtype=np.uint32),  # zero and subnormals
            np.array([0x7F800000, 0x7FC00000, 0x80000000, 0xBF800000, 0x7F7FFFFF], np.uint32),
        ]
    )
    x = torch.from_numpy(bits.view(np.int32)).cuda().view(torch.float32)
    y = torch.empty_like(x)
    _log2_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    ybits = bits_of(y)
    np.savez_compressed(out / "log2.npz", x=bits, y=ybits)
    res["log2"] = {"n": int(bits.size), "file": "log2.npz"}
    print(f"log2: {bits.size} inputs recorded", flush=True)


def record(res: dict, out: Path, deadline: float) -> None:
    """Forward and backward cases: inputs by seed (gpu/crosscheck/cases.py), outputs as bits."""
    arrays: dict[str, np.ndarray] = {}
    done_f, done_b = [], []
    for case in forward_cases():
        if time.time() > deadline:
            break
        x = {n: torch.from_numpy(a).cuda().to(DT[case.dtype]) for n, a in inputs(case).items()}
        debug = case.n_q * case.n_k <= 200 * 200
        try:
            o, lse, dbg = flash.forward(x["q"], x["k"], x["v"], causal=case.causal, softmax=case.softmax, debug=debug)
        except Exception as exc:  # noqa: BLE001 - record the failure, go on with the other cases
            res.setdefault("record_failures", []).append([case.key, repr(exc)[:300]])
            continue
        arrays[f"f/{case.key}/o"] = bits_of(o)
        arrays[f"f/{case.key}/lse"] = bits_of(lse)
        if dbg is not None:
            for name, t in dbg.items():
                arrays[f"f/{case.key}/dbg_{name}"] = bits_of(t)
        done_f.append(case.to_dict())
    for case in backward_cases():
        if time.time() > deadline:
            break
        x = {n: torch.from_numpy(a).cuda().to(DT[case.dtype]) for n, a in inputs(case).items()}
        o, lse, _ = flash.forward(x["q"], x["k"], x["v"], causal=case.causal, softmax=case.softmax)
        dq, dk, dv, delta = flash.backward(x["q"], x["k"], x["v"], o, lse, x["do"], causal=case.causal)
        for name, t in (("o", o), ("dq", dq), ("dk", dk), ("dv", dv), ("lse", lse), ("delta", delta)):
            arrays[f"b/{case.key}/{name}"] = bits_of(t)
        done_b.append(case.to_dict())
    res["record_files"] = save_parts(arrays, out, "attention_cases")
    fwd_cfg = {f"{d}_{'causal' if c else 'full'}": cfg.__dict__ for (d, c), cfg in flash.FWD_CONFIGS.items()}
    res["record"] = {
        "forward": done_f,
        "backward": done_b,
        "fwd_config": fwd_cfg,
        "bwd_config": {d: c.__dict__ for d, c in flash.BWD_CONFIGS.items()},
        "delta_block": flash.DELTA_BLOCK,
    }
    print(f"record: {len(done_f)} forward, {len(done_b)} backward cases", flush=True)


def save_parts(arrays: dict[str, np.ndarray], out: Path, stem: str, part_bytes: int = 14 << 20) -> list[str]:
    """Compressed .npz files of at most `part_bytes` of raw data each (the device returns files <= 16 MiB)."""
    files, part, size = [], {}, 0
    for key, arr in arrays.items():
        if part and size + arr.nbytes > part_bytes:
            files.append(f"{stem}_{len(files)}.npz")
            np.savez_compressed(out / files[-1], **part)
            part, size = {}, 0
        part[key], size = arr, size + arr.nbytes
    if part:
        files.append(f"{stem}_{len(files)}.npz")
        np.savez_compressed(out / files[-1], **part)
    return files


def sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }


def run_sdpa(q, k, v, *, backend, causal):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def accuracy(res: dict, deadline: float) -> None:
    """Errors against FP64 of ours (each variant) and of every SDPA backend, same inputs."""
    rows = []
    for dtype in ("bf16", "fp16"):
        for d in (64, 128):
            for kind in ("random", "repeated", "sink", "large"):
                for causal in (False, True):
                    if time.time() > deadline:
                        res["accuracy_stopped"] = "time"
                        break
                    q, k, v, do = kind_inputs(kind, dtype, (2, 8, 1024, d), d + len(kind))
                    o64, _, g64 = reference(q, k, v, causal, 1 / math.sqrt(d), do)
                    entry = {"dtype": dtype, "d": d, "kind": kind, "causal": causal}
                    for sm in flash.SOFTMAX_IDS:
                        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                        o = flash.attention(qq, kk, vv, causal=causal, softmax=sm)
                        o.backward(do)
                        entry[f"ours_{sm}"] = _errs(o, (qq.grad, kk.grad, vv.grad), o64, g64)
                    for name, be in sdpa_backends().items():
                        try:
                            qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                            o = run_sdpa(qq, kk, vv, backend=be, causal=causal)
                            o.backward(do)
                            entry[f"sdpa_{name}"] = _errs(o, (qq.grad, kk.grad, vv.grad), o64, g64)
                        except Exception as exc:  # noqa: BLE001 - a backend may not support a shape
                            entry[f"sdpa_{name}"] = repr(exc)[:200]
                    rows.append(entry)
    res["accuracy"] = rows
    print(f"accuracy: {len(rows)} input sets", flush=True)


def _errs(o, grads, o64, g64) -> dict:
    out = {
        "o_max": (o.double() - o64).abs().max().item(),
        "o_mean": (o.double() - o64).abs().mean().item(),
        "o_bias": (o.double() - o64).mean().item(),
    }
    for n, a, b in zip("qkv", grads, g64, strict=True):
        out[f"d{n}_max"] = (a.double() - b).abs().max().item()
        out[f"d{n}_mean"] = (a.double() - b).abs().mean().item()
    return out


def fp8(res: dict, out: Path, deadline: float) -> None:
    """FP8 E4M3 forward: outputs as bits for the emulator (gpu.crosscheck.cases.fp8_cases), errors against FP64 on the
    e4m3 values beside our bf16 kernel on the same values."""
    arrays: dict[str, np.ndarray] = {}
    done, errs = [], []
    for case in fp8_cases():
        if time.time() > deadline:
            res["fp8_stopped"] = "time"
            break
        x = inputs(case)
        q8, k8, v8 = (torch.from_numpy(x[n]).cuda().to(DT["e4m3"]) for n in ("q", "k", "v"))
        o, lse, _ = flash.forward(q8, k8, v8, causal=case.causal, softmax=case.softmax)
        arrays[f"f8/{case.key}/o"] = bits_of(o)
        arrays[f"f8/{case.key}/lse"] = bits_of(lse)
        qb, kb, vb = (t.to(torch.bfloat16) for t in (q8, k8, v8))
        ob, _, _ = flash.forward(qb, kb, vb, causal=case.causal, softmax=case.softmax)
        o64, _, _ = reference(qb, kb, vb, case.causal, 1 / math.sqrt(case.d))
        errs.append(
            {
                "case": case.key,
                "fp8_max": (o.double() - o64).abs().max().item(),
                "bf16_max": (ob.double() - o64).abs().max().item(),
                "fp8_mean": (o.double() - o64).abs().mean().item(),
                "bf16_mean": (ob.double() - o64).abs().mean().item(),
            }
        )
        done.append(case.to_dict())
    res["fp8_files"] = save_parts(arrays, out, "fp8_cases")
    res["fp8"] = {"cases": done, "errors": errs}
    print(f"fp8: {len(done)} cases", flush=True)


def kept_section(name: str, res: dict, out: Path, deadline: float, check: bool = True) -> None:
    """A section kept whole (`cast_sum`: the cast_sum softmax, FP8 inputs with the standard softmax too, and
    forward + backward cases in bf16 and fp16; `promote_pv`: FP8 with P V promoted to FP32, cast_sum and
    standard): every case run by the default kernel, outputs as bits (`NAME_cases_*.npz`, keys
    '<prefix>/<case>/<output>', prefixes as KEPT_SECTIONS names them); the tl and overlap forward kernels held
    to those bits where they run; then every case emulated and compared bit for bit on the spot, and the
    section's timings.  `check=False`: no emulator on the spot (the CPU test suite holds the kept recording to
    it), so the recording may run until shortly before the deadline."""
    from gpu.crosscheck.recorded import KEPT_SECTIONS

    fwd_prefix, bwd_prefix = KEPT_SECTIONS[name]
    fwd_cases, bwd_cases, bench = KEPT_CASES[name]
    # the recording stops early enough to leave the emulator its share (cold: its kernels compile first)
    record_until = time.time() + (0.6 if check else 0.8) * max(0.0, deadline - time.time())
    arrays: dict[str, np.ndarray] = {}
    done_f, done_b, kernels_differ, failed = [], [], [], []
    t0 = time.time()
    for case in bwd_cases():  # first: few, and the forward's cases may run out of time
        if time.time() > record_until:
            res[f"{name}_stopped"] = "time (recording)"
            break
        x = {n: torch.from_numpy(a).cuda().to(DT[case.dtype]) for n, a in inputs(case).items()}
        o, lse, _ = flash.forward(x["q"], x["k"], x["v"], causal=case.causal, softmax=case.softmax)
        dq, dk, dv, delta = flash.backward(x["q"], x["k"], x["v"], o, lse, x["do"], causal=case.causal)
        for out_name, t in (("o", o), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv), ("delta", delta)):
            arrays[f"{bwd_prefix}/{case.key}/{out_name}"] = bits_of(t)
        done_b.append(case.to_dict())
    for i, case in enumerate(fwd_cases()):
        if time.time() > record_until:
            res[f"{name}_stopped"] = "time (recording)"
            break
        if i % 20 == 0:
            print(f"{name}: recording forward case {i} ({time.time() - t0:.0f} s)", flush=True)
        x = {n: torch.from_numpy(a).cuda().to(DT[case.dtype]) for n, a in inputs(case).items() if n != "do"}
        kw = dict(causal=case.causal, softmax=case.softmax, promote_pv=case.promote_pv)
        try:
            o, lse, _ = flash.forward(x["q"], x["k"], x["v"], **kw)
        except Exception as exc:  # noqa: BLE001 - record the failure, go on with the other cases
            failed.append([case.key, repr(exc)[:300]])
            continue
        for kern in ("triton", "overlap"):
            try:
                got = flash.forward(x["q"], x["k"], x["v"], kernel=kern, **kw)
            except Exception as exc:  # noqa: BLE001 - e.g. no overlap kernel on this GPU: said in the JSON
                failed.append([f"{case.key} ({kern})", repr(exc)[:300]])
                continue
            if not same_bits((o, lse), got[:2]):
                kernels_differ.append([case.key, kern])
        arrays[f"{fwd_prefix}/{case.key}/o"] = bits_of(o)
        arrays[f"{fwd_prefix}/{case.key}/lse"] = bits_of(lse)
        done_f.append(case.to_dict())
    res[f"{name}_files"] = save_parts(arrays, out, f"{name}_cases")
    res[name] = {
        "command": f"OUT=$OUT bash studies/device/run_attention.sh {res['options']}",
        "forward": done_f,
        "backward": done_b,
        "kernels_differ": kernels_differ,
        "failed": failed,
        "fwd_config": {
            f"{dt}_{d}_{'causal' if c else 'full'}": fwd_config(dt, d, c).__dict__
            for dt in ("bf16", "fp16", "e4m3")
            for d, c in flash.FWD_CONFIGS
        },
        "bwd_config": {d: c.__dict__ for d, c in flash.BWD_CONFIGS.items()},
        "seconds_recording": round(time.time() - t0, 1),
    }
    print(
        f"{name}: recorded {len(done_f)} forward, {len(done_b)} backward cases, {len(failed)} failed; the tl or "
        f"overlap kernel differs from the recorded bits on {len(kernels_differ)}",
        flush=True,
    )
    if check:
        _section_check(name, res, arrays, done_f, done_b, deadline - 0.1 * max(0.0, deadline - time.time()))
    bench(res, deadline)


def _section_check(name: str, res: dict, arrays: dict, done_f: list, done_b: list, deadline: float) -> None:
    """Every recorded case of a kept section against the emulator, and how many FP8 inputs' O cast_sum changes
    (against the standard softmax's on the same inputs)."""
    from gpu.crosscheck.recorded import KEPT_SECTIONS, differences, outputs_of

    identical, differ, checked = 0, [], 0
    total = len(done_f) + len(done_b)
    for prefix, cases in zip(KEPT_SECTIONS[name], (done_f, done_b), strict=True):
        for c in cases:
            if time.time() > deadline:
                res[f"{name}_check_stopped"] = "time"
                break
            case = Case(**c)
            bad = differences(case, outputs_of(arrays, prefix, case))
            checked += 1
            identical += not bad
            if bad:
                differ.append([f"{prefix}/{case.key}", bad])
    fp8 = [Case(**c) for c in done_f if c["dtype"] == "e4m3" and c["softmax"] == "cast_sum"]
    pairs = [(c, Case(**{**c.to_dict(), "softmax": "standard"})) for c in fp8]
    key = KEPT_SECTIONS[name][0]
    changed = sum(
        not np.array_equal(arrays[f"{key}/{a.key}/o"], arrays[f"{key}/{b.key}/o"])
        for a, b in pairs
        if f"{key}/{b.key}/o" in arrays
    )
    res[f"{name}_check"] = {
        "identical": identical,
        "checked": checked,
        "total": total,
        "differ": differ,
        "fp8_o_changed_by_cast_sum": [changed, len(pairs)],
    }
    print(
        f"{name} against the emulator: {identical} / {total} cases identical in every output ({checked} checked, "
        f"{len(differ)} differ); FP8 inputs whose O cast_sum changes: {changed} / {len(pairs)}",
        flush=True,
    )
    for head, bad in differ[:10]:
        print("  differs:", head, bad[:3], flush=True)


def _cast_sum_bench(res: dict, deadline: float) -> None:
    """Forward milliseconds, standard against cast_sum, on the default kernel (B=4, H=32, N=4096)."""
    rows = []
    for dtype in ("bf16", "e4m3"):
        for d in (128,):
            for causal in (False, True):
                if time.time() + 10 > deadline:
                    res["cast_sum_bench_stopped"] = "time"
                    break
                q, k, v = rand((4, 32, 4096, d), torch.bfloat16)
                q, k, v = (x.to(DT[dtype]) for x in (q, k, v))
                row = {"dtype": dtype, "d": d, "causal": causal}
                for sm in ("standard", "cast_sum"):
                    row[sm] = bench_one(flash.forward, q, k, v, causal=causal, softmax=sm)
                row["ratio"] = row["cast_sum"] / row["standard"]
                rows.append(row)
                print(
                    f"cast_sum bench {dtype} d={d} causal={causal}: standard {row['standard']:.3f} ms, cast_sum "
                    f"{row['cast_sum']:.3f} ms ({row['ratio']:.3f}x)",
                    flush=True,
                )
    res["cast_sum_bench"] = rows


def _promote_pv_bench(res: dict, deadline: float) -> None:
    """FP8 forward milliseconds with P V promoted to FP32 every 32 keys against without, standard and cast_sum,
    on each kernel (B=4, H=32, N=4096)."""
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            q, k, v = (x.to(DT["e4m3"]) for x in rand((4, 32, 4096, d), torch.bfloat16))
            for kern in ("triton", "overlap"):
                if time.time() + 15 > deadline:
                    res["promote_pv_bench_stopped"] = "time"
                    res["promote_pv_bench"] = rows
                    return
                row = {"d": d, "causal": causal, "kernel": kern}
                try:
                    for sm in ("standard", "cast_sum"):
                        for p in (False, True):
                            row[f"{sm}{'_pv32' if p else ''}"] = bench_one(
                                flash.forward, q, k, v, causal=causal, softmax=sm, kernel=kern, promote_pv=p
                            )
                except Exception as exc:  # noqa: BLE001 - e.g. no overlap kernel for these tiles
                    row["error"] = repr(exc)[:300]
                rows.append(row)
                print(f"promote_pv bench: {row}", flush=True)
    res["promote_pv_bench"] = rows


#: the kept sections (gpu.crosscheck.recorded.KEPT_SECTIONS): their forward cases, forward + backward cases and
#: timings
KEPT_CASES = {
    "cast_sum": (cast_sum_cases, cast_sum_backward_cases, _cast_sum_bench),
    "promote_pv": (promote_pv_cases, list, _promote_pv_bench),
}


def overlap(res: dict, deadline: float) -> None:
    """The Gluon forward (kernel="overlap") against the tl forward (kernel="triton"): bits of O and LSE on
    every recorded forward case and on large adversarial batches, then both kernels' TFLOP/s."""
    rows = []
    for d in (64, 128):
        q, k, v = rand((4, 32, 4096, d), torch.bfloat16)
        for causal in (False, True):
            row = {"d": d, "n": 4096, "causal": causal}
            for kern in ("overlap", "triton"):
                for sm in flash.SOFTMAX_IDS:
                    ms = bench_one(flash.forward, q, k, v, causal=causal, softmax=sm, kernel=kern)
                    row[f"{kern}_{sm}"] = fwd_flops(4, 32, 4096, d, causal) / ms / 1e9
            rows.append(row)
            print("overlap bench", row, flush=True)
    res["overlap_bench"] = rows
    same, differ, failed = 0, [], []

    def compare(key, q, k, v, causal, sm):
        nonlocal same
        try:
            a = flash.forward(q, k, v, causal=causal, softmax=sm, kernel="overlap")
            b = flash.forward(q, k, v, causal=causal, softmax=sm, kernel="triton")
        except Exception as exc:  # noqa: BLE001 - record, go on
            failed.append([key, repr(exc)[:300]])
            return
        if same_bits(a[:2], b[:2]):
            same += 1
        else:
            differ.append(key)

    for case in forward_cases():
        if time.time() > deadline:
            break
        x = {n: torch.from_numpy(a).cuda().to(DT[case.dtype]) for n, a in inputs(case).items()}
        compare(case.key, x["q"], x["k"], x["v"], case.causal, case.softmax)
    for i, kind in enumerate(("random", "repeated", "sink", "negative_v", "large", "tiny")):
        for d in (64, 128):
            q, k, v, _ = kind_inputs(kind, "bf16" if i % 2 else "fp16", (2, 4, 4096 - 61 * i, d), 77 + i)
            for causal in (False, True):
                for sm in flash.SOFTMAX_IDS:
                    compare(f"{kind}/{d}/{causal}/{sm}", q, k, v, causal, sm)
    res["overlap_bits"] = {"identical": same, "differ": differ, "failed": failed}
    print(f"overlap: {same} identical, {len(differ)} differ, {len(failed)} failed", flush=True)


def replay(res: dict, deadline: float, first: int = 0) -> None:
    """Rerun every kept recorded case (gpu/data: forward, backward, FP8) with the current
    kernels, both forward kernels where both run, and compare every output's bits with the recording: a
    kernel change that keeps these bits keeps the emulator's agreement (the CPU tests check the recording
    against the emulator). `first` skips the recorded runs before it, to finish a replay that ran out of
    time (a cold machine compiles every kernel first)."""
    from gpu.crosscheck.recorded import recorded_runs

    same, differ = 0, []
    runs = recorded_runs()
    if not 0 <= first <= len(runs):
        raise ValueError(f"--replay-from must be in 0..{len(runs)} (recorded runs), got {first}")
    done = first
    for run in runs[first:]:
        if time.time() > deadline:
            res["replay_stopped"] = f"time, before run {done} of {len(runs)}"
            break
        done += 1
        x = [torch.from_numpy(a[None]).cuda().to(DT[run.dtype]) for a in (run.q, run.k, run.v)]
        for kern in ("triton", "overlap") if run.dtype != "e4m3" else ("triton",):
            o, lse, _ = flash.forward(
                *x, causal=run.causal, sm_scale=run.sm_scale, softmax=run.softmax, kernel=kern
            )  # the default tiles, as recorded
            got = {"o": o, "lse": lse}
            if run.do is not None:
                do = torch.from_numpy(run.do[None]).cuda().to(DT[run.dtype])
                got.update(
                    zip(
                        ("dq", "dk", "dv", "delta"),
                        flash.backward(*x, o, lse, do, causal=run.causal, sm_scale=run.sm_scale),
                        strict=True,
                    )
                )
            bad = [n for n, t in got.items() if n in run.keys and not run.digest(n).matches(bits_of(t)[0])]
            if bad:
                differ.append([run.note, kern, bad])
            else:
                same += 1
    res["replay"] = {"identical": same, "differ": differ, "runs": [first, done], "of": len(runs)}
    print(
        f"replay of recorded runs {first}-{done - 1} of {len(runs)}: {same} identical, {len(differ)} differ "
        f"{differ[:5]}",
        flush=True,
    )


def train(res: dict, deadline: float, steps: int = 300) -> None:
    """A small causal transformer on a fixed synthetic token stream: ours vs SDPA, same init and data."""
    from .train_check import run_training

    res["train"] = run_training(steps=steps, deadline=deadline)
    print(
        "train:",
        {k: v[-1] if isinstance(v, list) and v else v for k, v in res["train"].items() if k.startswith("loss")},
        flush=True,
    )


SECTIONS = (
    "smoke",
    "configs",
    "log2",
    "record",
    "accuracy",
    "fp8",
    "overlap",
    "replay",
    "train",
    "cast_sum",
    "promote_pv",
)


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m studies.device.run_attention", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for attention.json and the recorded cases")
    ap.add_argument("--sections", default="smoke", help=f"comma list of {', '.join(SECTIONS)}; default smoke")
    ap.add_argument("--seconds", type=float, default=540, help="overall time budget (default 540)")
    ap.add_argument(
        "--replay-from",
        type=int,
        default=0,
        help="section replay: start at this recorded run (0-based; to finish a replay cut short)",
    )
    ap.add_argument(
        "--no-check",
        action="store_true",
        help="sections cast_sum and promote_pv: record and time only, no emulator on the spot "
        "(python -m tools.keep_recording keeps their digests; the CPU tests hold them to the emulator)",
    )
    return ap


def run(args: argparse.Namespace) -> int:
    wanted = sections(args.sections, SECTIONS)
    positive(args.seconds, "--seconds")
    if args.replay_from < 0:
        raise UsageError(f"--replay-from: expected an index >= 0, got {args.replay_from}")
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.run_attention")
    t0 = time.time()
    deadline = t0 + args.seconds
    options = f"--sections {args.sections} --seconds {args.seconds:g}" + (" --no-check" if args.no_check else "")
    res: dict = {"env": env(), "sections": args.sections, "options": options}
    # the sections run the robust variant on purpose (recordings, comparisons): its FutureWarning is for users
    warnings.filterwarnings("ignore", message="softmax 'robust' leans O", category=FutureWarning)
    for name in wanted:
        t = time.time()
        if t > deadline:
            res[f"{name}_skipped"] = "time"
            continue
        try:
            if name in ("log2",):
                log2(res, out)
            elif name == "replay":
                replay(res, deadline, args.replay_from)
            elif name in KEPT_CASES:
                kept_section(name, res, out, deadline, check=not args.no_check)
            elif name in ("record", "fp8"):
                globals()[name](res, out, deadline)
            else:
                globals()[name](res, deadline)
        except Exception as exc:  # noqa: BLE001 - keep what the other sections measured
            import traceback

            res[f"{name}_error"] = traceback.format_exc()[-3000:]
            print(f"{name} failed: {exc!r}", flush=True)
        res[f"{name}_seconds"] = round(time.time() - t, 1)
        (out / "attention.json").write_text(json.dumps(res, indent=1, default=str))
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("python -m studies.device.run_attention", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
