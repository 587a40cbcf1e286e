"""Model a kernel that is not the project's, with the public API only, and cross-check it bit for bit.

The kernel below is a small Triton flash-attention forward written here (fp16, 64 x 64 tiles, 4 warps, N a
multiple of 64, no masking; the LSE in base 2 from `tl.math.log2`).  Its policy is built from flashsim's
step specs and emufloat's H100 models, and registered under a name so that saved runs name it.  On a GPU
the kernel runs live; everywhere, its recorded H100 runs (`tests/data/model_your_kernel/tiny.json`: the SHA-256
of each run's outputs, kept from the live test's files with `RECORD_DIR` set) are checked against the emulator.
docs/model-your-kernel.md walks through the same steps.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

import flashsim as fs
from emufloat import FP16, FP32
from emufloat.hw import h100
from flashsim.crosscheck import crosscheck, save_run
from flashsim.recording import RecordedRun, Recording, run_from_entry
from flashsim.testing import make_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "model_your_kernel"
BLOCK = 64

TINY = fs.Policy(
    name="tiny_kernel",
    note="the test's Triton kernel: fp16, 64 x 64 tiles, 4 warps",
    scores=fs.specs.Dot(FP16, h100.WGMMA_FP16),  # s = tl.dot(q, k): wgmma, fp32 accumulator
    scale=fs.specs.Scale("max", FP32),  # m = max(m, tl.max(s, 1) * c)
    mask=fs.specs.Mask(),
    max=fs.specs.Op(FP32),
    subtract=fs.specs.Op(FP32, fused=True),  # s * c - m: one FMA
    exp=fs.specs.Func("h100_ex2", FP32),  # tl.math.exp2: ex2.approx.ftz
    row_sum=fs.specs.RowSum("h100_tl_sum", FP32, fused=True, num_warps=4),  # l = l * alpha + tl.sum(p, 1): FMA
    p_cast=fs.specs.Op(FP16),  # p.to(tl.float16)
    pv=fs.specs.Dot(FP16, h100.WGMMA_FP16, into_acc=True),  # tl.dot(p, v, acc * alpha)
    rescale=fs.specs.Op(FP32),
    o_accum=fs.specs.Op(FP32),
    normalize=fs.specs.Norm("divide", "div_full", FP32),  # acc / l: div.full.f32
    output=fs.specs.Op(FP16),
    lse=fs.specs.Func("libdevice_log2f", FP32),  # m + tl.math.log2(l): libdevice's log2f
    tiling=fs.specs.Tiling(BLOCK, BLOCK, "forward"),
)
if "tiny_kernel" not in fs.policy_names():
    fs.register_policy(TINY)

try:
    import torch
    import triton
    import triton.language as tl

    CUDA = torch.cuda.is_available()
except ImportError:
    CUDA = False
    triton = None

if triton is not None:

    @triton.jit
    def tiny_attention(Q, K, V, O, L, sm_scale, N, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        dims = tl.arange(0, D)
        q = tl.load(Q + rows[:, None] * D + dims[None, :])
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)  # noqa: E741
        acc = tl.zeros([BM, D], tl.float32)
        c = sm_scale * 1.4426950408889634
        for start in range(0, N, BN):
            cols = start + tl.arange(0, BN)
            k = tl.load(K + cols[None, :] * D + dims[:, None])
            s = tl.dot(q, k)
            m_new = tl.maximum(m, tl.max(s, 1) * c)
            p = tl.math.exp2(s * c - m_new[:, None])
            alpha = tl.math.exp2(m - m_new)
            l = l * alpha + tl.sum(p, 1)  # noqa: E741
            v = tl.load(V + cols[:, None] * D + dims[None, :])
            acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
            m = m_new
        tl.store(O + rows[:, None] * D + dims[None, :], (acc / l[:, None]).to(tl.float16))
        tl.store(L + rows, m + tl.math.log2(l))


def run_tiny(q, k, v, sm_scale):
    """The kernel on one head of fp16 torch tensors (N, d) on the GPU: (O, LSE in base 2)."""
    n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(n, dtype=torch.float32, device=q.device)
    tiny_attention[(n // BLOCK,)](q, k, v, o, lse, sm_scale, n, D=d, BM=BLOCK, BN=BLOCK, num_warps=4)
    return o, lse


def tiny_kernel(q, k, v, causal, sm_scale):
    """The kernel as gpu.crosscheck calls one: (1, 1, N, d) tensors in, (O, LSE) out (no causal masking).

    `python -m gpu.crosscheck --live --kernel tests.test_model_your_kernel:tiny_kernel --policy tiny_kernel`
    """
    if causal:
        raise ValueError("causal: the test's kernel does not mask")
    o, lse = run_tiny(q[0, 0].contiguous(), k[0, 0].contiguous(), v[0, 0].contiguous(), sm_scale)
    return o[None, None], lse[None, None]


CASES = [
    (kind, n, d, 5200 + i)
    for i, (kind, n, d) in enumerate(
        (kind, n, d)
        for kind in ("random", "repeated", "near_repeated", "sink", "large", "tiny", "negative_v")
        for n, d in ((128, 64), (192, 128))
    )
]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch, Triton)")
@pytest.mark.parametrize(("kind", "n", "d", "seed"), CASES)
def test_live_kernel_is_the_policy_bit_for_bit(kind, n, d, seed):
    from gpu.crosscheck.kernels import kernel_run

    x = make_inputs(kind, n, n, d, "fp16", seed)
    run = kernel_run(
        tiny_kernel,
        x["q"],
        x["k"],
        x["v"],
        policy="tiny_kernel",
        dtype="fp16",
        note=f"tiny_kernel {kind} n={n} d={d} seed={seed}",
    )
    if os.environ.get("RECORD_DIR"):
        save_run(Path(os.environ["RECORD_DIR"]) / f"tiny_{kind}_{n}_{d}_{seed}.npz", run)
    report = crosscheck(run)
    assert report.identical, str(report)


def recorded() -> list[RecordedRun]:
    """The recorded runs: each named tiny_<kind>_<n>_<d>_<seed>, its inputs regenerated (and checked against the
    recording's digests of them)."""
    if not (DATA / "tiny.json").is_file():
        return []
    rec = Recording.load(DATA / "tiny.json")
    runs = []
    for entry in rec.meta["runs"]:
        kind, n, d, seed = entry["name"].removeprefix("tiny_").rsplit("_", 3)
        x = make_inputs(kind, int(n), int(n), int(d), "fp16", int(seed))
        runs.append(run_from_entry(rec, entry, {name: x[name][None] for name in ("q", "k", "v")}))
    return runs


@pytest.mark.skipif(not recorded(), reason="no recorded runs of the tiny kernel")
def test_recorded_runs_are_the_policy_bit_for_bit():
    """Every run the H100 recorded (provenance: tests/data/model_your_kernel/README.md) is reproduced."""
    runs = recorded()
    assert len(runs) == len(CASES)
    for run in runs:
        assert run.resolve_policy() == TINY
        report = run.check(counts=False)
        assert report.identical, str(report)


def test_a_changed_step_is_seen():
    """Not vacuous: the same recorded run under a policy with the correctly rounded log2 for the LSE."""
    runs = recorded()
    if not runs:
        pytest.skip("no recorded runs of the tiny kernel")
    import dataclasses

    other = dataclasses.replace(TINY, name="tiny_kernel_log2", lse=fs.specs.Func("log2", FP32))
    changed = 0
    for run in runs:
        rep = run.check(policy=other, counts=False)
        changed += not rep.same["lse"]
        assert rep.same["o"]
    assert changed > 0


def test_policy_is_public_api_only():
    """The policy round-trips through a saved run by its registered name."""
    x = make_inputs("repeated", 64, 64, 64, "fp16", 1)
    f = fs.flash_forward(x["q"], x["k"], x["v"], TINY, sm_scale=1 / math.sqrt(64))
    assert f.o.dtype == np.float16 and f.lse.dtype == np.float32
