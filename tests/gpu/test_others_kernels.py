"""Kernels the project did not write, replayed bit for bit: Triton's fused-attention tutorial (fp16, forward
and, for causal cases, backward) and PyTorch SDPA's flash backend (FlashAttention-2; bf16 and fp16, forward
and backward).

The GPU ran the tutorial file unmodified, its autotuner included, and SDPA through torch, on fresh inputs of
every kind (studies/device/record_kernels.py; provenance in each folder's others.json, which keeps the SHA-256 of
every output: flashsim.recording; others.npz, where present, the GPU's bits where the emulator differs); each
case is held to
`gpu.policies.tutorial_policy` for the tiles the autotuner chose, or to `gpu.policies.sdpa_flash_policy`.
"""

from pathlib import Path

import numpy as np
import pytest

import flashsim as fs
from flashsim.crosscheck import crosscheck
from flashsim.recording import Recording
from gpu.crosscheck import others

DATA = Path(__file__).resolve().parents[1] / "data" / "others"
RUNS = others.recorded_runs(DATA, "tutorial")


def test_the_recording_covers_the_grid():
    assert sum(r.backward for r in RUNS) >= 36  # the causal cases carry dQ, dK, dV
    from flashsim.testing import KINDS

    kinds = {c["case"]["kind"] for c in others.recording(DATA).meta["cases"]}
    assert len(RUNS) >= 50 and kinds == set(KINDS)
    assert {r.causal for r in RUNS} == {False, True} and {r.q.shape[-1] for r in RUNS} == {64, 128}


@pytest.mark.parametrize("run", RUNS, ids=[r.note for r in RUNS])
def test_tutorial_is_bit_identical(run):
    report = run.check(counts=False)
    assert report.identical and report.attention.attention, str(report)


def _is_attention(run) -> bool:
    """The attention check of a recorded run (its device bits, proven by the digests) under its policy."""
    from flashsim.bounds import check_attention
    from flashsim.crosscheck import from_bits, stored_formats

    pol, out = run.resolve_policy(), run.outputs()
    o, lse = from_bits(out["o"], stored_formats(pol)["o"]), from_bits(out["lse"], None)
    return check_attention(run.q, run.k, run.v, o, lse, pol, run.softmax, run.sm_scale, run.causal).attention


def test_no_recorded_tutorial_run_is_flagged():
    """The tiles its autotuner picked for these lengths compute attention: no correct case is flagged."""
    assert all(_is_attention(run) for run in RUNS)


def _tutorial_function(q, k, v, bm: int, bn: int, scale: float) -> np.ndarray:
    """In FP64, what the tutorial's two causal loops add up, read from its code: the Q block at row r adds keys
    [0, r) in BLOCK_N-wide loads, unmasked, then [r, r + BLOCK_M) masked, so a key both loops load counts twice."""
    n = q.shape[0]
    count = np.zeros((n, n))
    for r in range(0, n, bm):
        for j in range(0, r, bn):
            count[r : r + bm, j : j + bn] += 1
        for j in range(r, r + bm, bn):
            cols = np.arange(j, min(j + bn, n))
            count[r : r + bm, j : j + bn] += cols[None, :] <= np.arange(r, r + bm)[:, None]
    s = np.where(count > 0, scale * (q.astype(np.float64) @ k.astype(np.float64).T), -np.inf)
    w = count * np.exp(s - s.max(axis=1, keepdims=True))
    return (w @ v.astype(np.float64)) / w.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("d", [64, 128])
def test_tutorial_with_block_n_above_block_m_is_flagged_and_replayed(d):
    """BLOCK_M 64, BLOCK_N 128 (an autotuned pick on the H200 at causal d 128, N 1024/2048): the policy replays the
    function the tutorial computes (within rounding of an FP64 model read from its code) and the cross-check's
    attention line flags it."""
    from flashsim.bounds import check_attention
    from flashsim.inputs import make_inputs
    from gpu.policies import tutorial_policy

    x = make_inputs("random", 256, 256, d, "fp16", 12)
    q, k, v = (x[name][None] for name in "qkv")
    pol, scale = tutorial_policy(64, 128), 1 / np.sqrt(d)
    f = fs.flash_forward(q, k, v, pol, causal=True, sm_scale=scale)
    o = f.o.astype(np.float64)[0]
    model = _tutorial_function(x["q"], x["k"], x["v"], 64, 128, scale)
    assert np.max(np.abs(o - model) / np.maximum(1, np.abs(model))) < 4e-3
    c = check_attention(q, k, v, f.o.astype(np.float64), f.lse, pol, sm_scale=scale, causal=True)
    assert not c.attention and c.beyond > 0 and "computes another function" in str(c)
    rows = sorted({r for r in range(64, 256) if (r // 64) % 2 == 1})  # odd Q blocks: their keys counted twice
    exact = fs.reference_attention(q, k, v, "fp64", causal=True, sm_scale=scale).o[0]
    assert np.max(np.abs(o[rows] - exact[rows])) > 0.05 and np.max(np.abs(o[:64] - exact[:64])) < 4e-3


def test_the_lse_needs_libdevice_log2f():
    """Not vacuous: with the project's own log2 the LSE differs in some rows, O does not."""
    import dataclasses

    from emufloat import FP32
    from flashsim.specs import Func

    changed = 0
    for run in RUNS[:16]:
        pol = run.resolve_policy()
        other = dataclasses.replace(pol, name=pol.name + "_log2fma", lse=Func("log2_fma", FP32))
        rep = run.check(policy=other, counts=False)
        assert rep.same["o"]
        changed += not rep.same["lse"]
    assert changed > 0


def test_the_backward_needs_its_own_schedule():
    """Not vacuous: without the prescaled K and the diagonal-first dQ order, the backward differs."""
    import dataclasses

    from emufloat import FP32
    from flashsim.specs import BwdTiling, Recompute

    runs = [r for r in RUNS if r.backward and r.q.shape[1] == 256][:4]  # two Q blocks: the dQ order shows
    for change in (
        {"recompute": Recompute("h100_ex2", FP32, fused=True)},
        {"bwd_tiling": BwdTiling(128, 128, kv_order="forward")},
    ):
        differ = 0
        for run in runs:
            pol = run.resolve_policy()
            other = dataclasses.replace(pol, name=pol.name + "_changed", **change)
            rep = run.check(policy=other, counts=False)
            differ += not all(rep.same[n] for n in ("dq", "dk", "dv"))
        assert differ > 0, change


# ---- SDPA's flash backend (FlashAttention-2 as PyTorch builds it): forward and backward bit for bit -------------
SDPA_DATA = Path(__file__).resolve().parents[1] / "data" / "sdpa_flash"
SDPA = others.recorded_runs(DATA, "sdpa_flash") + others.recorded_runs(SDPA_DATA, "sdpa_flash")


def test_sdpa_cases_cover_both_kernels_of_fa2_and_the_backward():
    """Head dim 128 with N = 200 runs FA2's split-KV kernel (two key splits), head dim 64 with N = 128 not; two
    recordings (fresh seeds each), bf16 and fp16, every input kind, causal and not; the backward of 28."""
    from flashsim.testing import KINDS

    assert len(SDPA) == 84
    assert {r.resolve_policy().tiling.kv_splits for r in SDPA} == {1, 2}
    assert {r.dtype for r in SDPA} == {"bf16", "fp16"} and {r.causal for r in SDPA} == {False, True}
    assert sum(r.backward for r in SDPA) == 28
    kinds = {c["case"]["kind"] for c in others.recording(SDPA_DATA).meta["cases"]}
    assert kinds == set(KINDS)


@pytest.mark.parametrize("run", SDPA, ids=[r.note for r in SDPA])
def test_sdpa_flash_is_bit_identical(run):
    report = run.check(counts=False)
    assert report.identical and report.attention.attention, str(report)


def test_fa2_dq_atomics_are_nondeterministic_only_beyond_two_kv_blocks():
    """Recorded on the GPU: 8 identical backward launches a length; dQ (atomicAdd over K/V blocks) varies from
    three K/V blocks on, dK and dV never.  The recorded cases have at most two K/V blocks."""
    seen = others.recording(SDPA_DATA).meta["fa2_dq_atomics"]
    assert seen["n128_kv_blocks1"] == seen["n256_kv_blocks2"] == {"dq": 1, "dk": 1, "dv": 1}
    for key in ("n384_kv_blocks3", "n1024_kv_blocks8"):
        assert seen[key]["dq"] > 1 and seen[key]["dk"] == seen[key]["dv"] == 1
    assert max(r.q.shape[1] for r in SDPA) <= 256


def _differ(runs, outputs, **change) -> int:
    """How many of `runs` differ in some of `outputs` under their policy with `change` (by the digests)."""
    import dataclasses

    total = 0
    for run in runs:
        pol = run.resolve_policy()
        other = dataclasses.replace(pol, name=pol.name + "_changed", **change)
        rep = run.check(policy=other, counts=False)
        total += not all(rep.same[n] for n in outputs)
    return total


def test_each_modelled_detail_of_fa2_matters():
    """Not vacuous: undoing any one finding changes outputs the GPU recorded."""
    from emufloat import FP32
    from flashsim.specs import Func, Grad, Norm, Op, RowSum

    def blocks(run):
        t = run.resolve_policy().tiling
        return -(-run.k.shape[1] // t.block_n) // t.kv_splits

    fwd = [r for r in SDPA if blocks(r) > 1][:8]  # two K/V blocks in one pass: the rescale shows
    assert len(fwd) == 8
    assert _differ(fwd, ("o", "lse"), subtract=Op(FP32, fused=True)) > 0  # no UNFUSE_FMA
    assert _differ(fwd, ("lse",), row_sum=RowSum("fa2_threads", FP32)) > 0  # l *= a; l += p not contracted
    assert _differ(fwd, ("o",), normalize=Norm("reciprocal", "rcp_approx", FP32)) > 0  # fast-math 1/l
    assert _differ(fwd, ("lse",), lse=Func("log", FP32)) > 0  # a correctly rounded log for __logf
    large = [r for r in SDPA if r.backward and "_large_" in r.note]
    pol = large[0].resolve_policy()
    plain = Grad(pol.dq.dot, pol.dq.accum, pol.dq.out)  # atomicAdd without flushing subnormals
    assert _differ(large, ("dq",), dq=plain) > 0


def test_the_split_is_what_sdpa_computes():
    """Not vacuous: the same split cases through one pass of FA2's standard tiles agree far less."""
    import dataclasses

    from flashsim.specs import Tiling

    split_runs = [r for r in SDPA if r.resolve_policy().tiling.kv_splits == 2][::3]
    one_pass = split_runs[0].resolve_policy()
    one_pass = dataclasses.replace(one_pass, name="one_pass", tiling=Tiling(128, 64, "reverse"))
    split_ok = one_ok = total = 0
    for run in split_runs:
        total += run.q.shape[1] * run.q.shape[2]
        split_ok += run.check().agreement("o")[0]  # the GPU's bits: the emulator's, proven by the digest
        one_ok += run.check(policy=one_pass).agreement("o")[0]
    assert split_ok == total and one_ok < 0.99 * total


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU with torch")
@pytest.mark.parametrize(
    "case",
    others.grid("sdpa_flash", round_=2)[::7] + others.grid("sdpa_efficient", round_=2)[::7],
    ids=lambda c: c.key,
)
def test_live_sdpa_forward(case):
    """On a GPU: SDPA's flash and memory-efficient backends, run now on fresh seeds, against their models."""
    from gpu.crosscheck.kernels import kernel_run, sdpa

    x = case.inputs()
    run = kernel_run(
        sdpa(case.kernel.removeprefix("sdpa_")),
        x["q"],
        x["k"],
        x["v"],
        policy=others.policy_of(case),
        dtype=case.dtype,
        causal=case.causal,
        note=case.key,
    )
    report = crosscheck(run)
    assert report.identical, str(report)


# ---- SDPA's memory-efficient backend (xformers' CUTLASS kernels as PyTorch builds them) -------------------------
EFF_DATA = Path(__file__).resolve().parents[1] / "data" / "sdpa_efficient"
EFFICIENT = others.recorded_runs(EFF_DATA, "sdpa_efficient")


def _key_blocks(run) -> int:
    return -(-run.k.shape[1] // run.resolve_policy().bwd_tiling.block_n)


def test_efficient_cases_cover_the_grid():
    """Head dim 64 with N = 128 and head dim 128 with N = 200 have two key blocks in the backward, head dim 128
    with N = 128 one; bf16 and fp16 forward, the bf16 backward."""
    from flashsim.testing import KINDS

    assert len(EFFICIENT) == 84 and sum(r.backward for r in EFFICIENT) == 42
    assert {r.dtype for r in EFFICIENT} == {"bf16", "fp16"} and {r.causal for r in EFFICIENT} == {False, True}
    assert {_key_blocks(r) for r in EFFICIENT if r.backward} == {1, 2}
    assert {c["case"]["kind"] for c in others.recording(EFF_DATA).meta["cases"]} == set(KINDS)


@pytest.mark.parametrize("run", EFFICIENT, ids=[r.note for r in EFFICIENT])
def test_sdpa_efficient_is_bit_identical_but_for_dq_with_several_key_splits(run):
    """O, LSE, dK and dV always; dQ where one thread block owns every key block (a single key block here).  The
    recording keeps the GPU's dQ elements that the emulator does not give (others.npz): the dQ rebuilt from them
    has the recorded digest."""
    report = run.check()
    for name, same in report.same.items():
        if name != "dq" or _key_blocks(run) == 1:
            assert same, str(report)
    assert report.attention.attention, str(report)
    assert set(report.checks) == set(report.same)  # every output's GPU bits are known


EFF_DET = others.recorded_runs(Path(__file__).resolve().parents[1] / "data" / "sdpa_efficient_det", "sdpa_efficient")


@pytest.mark.parametrize("run", EFF_DET, ids=[r.note for r in EFF_DET])
def test_sdpa_efficient_deterministic_path_is_bit_identical(run):
    """Recorded under torch.use_deterministic_algorithms(True): one thread block takes the key blocks in order,
    so dQ (four key blocks at N = 200) is identical too; the policy is the deterministic one."""
    assert run.resolve_policy().bwd_tiling.q_order == "forward"
    report = run.check(counts=False)
    assert report.identical and report.attention.attention, str(report)


def test_efficient_deterministic_cases_have_several_key_blocks():
    assert len(EFF_DET) == 28 and sum(r.backward for r in EFF_DET) == 14
    assert {_key_blocks(r) for r in EFF_DET if r.backward} == {4}


def _with_kv_order(run, order: str):
    """The run's policy with the key blocks continuing dQ in `order`."""
    import dataclasses

    pol = run.resolve_policy()
    tiling = dataclasses.replace(pol.bwd_tiling, kv_order=order)
    return dataclasses.replace(pol, name=f"{pol.name}_{order}", bwd_tiling=tiling)


def test_efficient_dq_is_one_of_the_orders_the_key_blocks_can_take():
    """With two key blocks in parallel thread blocks, each query block's dQ is continued by one key block, then
    the other, in the order they reach the lock: every recorded query block equals the model with one of the
    two orders, and both orders occur (the order is the GPU's, not the model's)."""
    seen = {"forward": 0, "reverse": 0}
    for run in [r for r in EFFICIENT if r.backward and _key_blocks(r) == 2][:14]:
        gpu = run.outputs()["dq"]  # the GPU's bits: the emulator's with the recorded patch, proven by the digest
        emu = {o: run.emulate(_with_kv_order(run, o))["dq"] for o in seen}
        bm = run.resolve_policy().bwd_tiling.block_m
        for i0 in range(0, run.q.shape[1], bm):
            hit = [o for o in seen if np.array_equal(emu[o][:, i0 : i0 + bm], gpu[:, i0 : i0 + bm])]
            assert hit, f"{run.note}, query block at {i0}"
            if len(hit) == 1:
                seen[hit[0]] += 1
    assert min(seen.values()) > 0, seen


def test_each_modelled_detail_of_the_efficient_kernel_matters():
    """Not vacuous: the 8-product mma.sync blocks, the two scale multiplies, the warp-column row sums, the LSE's
    division, the backward's rounded P in dS and its rotated query order each change recorded outputs."""
    import dataclasses

    from emufloat import FP32
    from emufloat.hw import h100
    from flashsim.specs import Dot, Func, RowSum, Scale, SoftmaxGrad

    runs = [r for r in EFFICIENT if r.q.shape[-1] == 128 and r.dtype == "bf16"][:8]  # 1/sqrt(128): not a power of 2
    fmt = runs[0].resolve_policy().scores.fmt
    assert _differ(runs, ("o", "lse"), scores=Dot(fmt, h100.WGMMA_BF16)) > 0
    assert _differ(runs, ("o", "lse"), scale=Scale("scores", FP32)) > 0
    assert _differ(runs, ("lse",), row_sum=RowSum("sequential", FP32)) > 0
    assert _differ(runs, ("lse",), lse=Func("libdevice_logf", FP32)) > 0
    back = [r for r in EFFICIENT if r.backward][:12]
    assert _differ(back, ("dk", "dv"), ds=SoftmaxGrad(FP32, scale_at="ds")) > 0
    rotated = [r for r in EFFICIENT if r.backward and not r.causal and _key_blocks(r) == 2]
    pol = rotated[0].resolve_policy()
    assert _differ(rotated, ("dk", "dv"), bwd_tiling=dataclasses.replace(pol.bwd_tiling, q_order="forward")) > 0


def test_efficient_key_splits_follow_pytorch():
    """One thread block over the keys when deterministic, or with 256 heads or more and at most two key blocks;
    otherwise one per key block (and then the rotated query order)."""
    from gpu.policies import efficient_key_splits, sdpa_efficient_policy

    assert efficient_key_splits(200, 64) == 4 and efficient_key_splits(200, 128) == 2
    assert efficient_key_splits(200, 64, deterministic=True) == 1
    assert efficient_key_splits(128, 64, batch_heads=256) == 1 and efficient_key_splits(192, 64, batch_heads=256) == 3
    assert sdpa_efficient_policy("bf16", 64, 200).bwd_tiling.q_order == "rotated"
    assert sdpa_efficient_policy("bf16", 64, 200, deterministic=True).bwd_tiling.q_order == "forward"
    case = others.grid("sdpa_efficient")[0]
    assert others.policy_of(case, deterministic=True).kwargs["deterministic"] is True


def test_a_kernel_registered_from_a_test_gets_its_grid_and_policy():
    """A recorded kernel is a value: registering one gives it a grid and a policy, with no edit of gpu/."""
    from flashsim.policy import PolicyRef

    mine = others.RecordedKernel(
        "test_mine", 7, lambda case, config, det: PolicyRef("triton_h100"), lengths=(96,), dtypes=("fp16",)
    )
    others.RECORDED.register(mine, replace=True)
    cases = others.grid("test_mine")
    assert {(c.n, c.dtype) for c in cases} == {(96, "fp16")} and cases[0].seed == others.SEED0 + 700_000
    assert str(others.policy_of(cases[0])) == "triton_h100"
    unknown = others.grid("not_registered")  # a user's kernel by name only: fa2, seed block 4
    assert unknown[0].seed == others.SEED0 + 400_000 and str(others.policy_of(unknown[0])) == "fa2"


# ---- SDPA's cuDNN backend: closed; each step pinned by crafted inputs, then checked on fresh cases ------------
CUDNN_DATA = Path(__file__).resolve().parents[1] / "data" / "sdpa_cudnn"
CUDNN = others.recorded_runs(CUDNN_DATA, "sdpa_cudnn")


def _agreement(runs, **change) -> dict[str, float]:
    import dataclasses

    hits: dict[str, list[int]] = {}
    for run in runs:
        pol = run.resolve_policy()
        other = dataclasses.replace(pol, name=pol.name + "_changed", **change) if change else None
        for c in run.check(policy=other).checks.values():  # against the GPU's bits (kept as digests and patches)
            h = hits.setdefault(c.name, [0, 0])
            h[0] += c.identical
            h[1] += c.n
    return {name: a / n for name, (a, n) in hits.items()}


def test_cudnn_cases_cover_the_grid():
    cells = {(r.dtype, r.q.shape[-1], r.causal) for r in CUDNN}
    assert len(CUDNN) == 56 and len(cells) == 8


@pytest.mark.parametrize("run", CUDNN, ids=[r.note for r in CUDNN])
def test_sdpa_cudnn_forward_is_bit_identical(run):
    report = run.check()
    assert set(report.checks) == ({"o", "lse", "dq", "dk", "dv"} if run.backward else {"o", "lse"})
    assert report.same["o"] and report.same["lse"] and report.attention.attention, str(report)


def test_cudnn_backward_is_bit_identical_on_the_kept_cases():
    """The 28 kept bf16 cases with gradients: every element of dQ, dK and dV as the model gives it."""
    runs = [r for r in CUDNN if r.backward]
    assert len(runs) == 28
    assert _agreement(runs) == {"o": 1.0, "lse": 1.0, "dq": 1.0, "dk": 1.0, "dv": 1.0}


def test_each_modelled_detail_of_the_cudnn_backward_matters():
    """delta's pairs-then-left-to-right order, the scale on dS and the Q blocks in order: undoing any one loses
    agreement (the recompute's FMA and dS's flush show on fp16: tests/gpu/test_fresh_check_recorded.py)."""
    from emufloat import FP32
    from flashsim.specs import BwdTiling, Delta, SoftmaxGrad

    by_d = {d: [r for r in CUDNN if r.backward and r.q.shape[-1] == d][:6] for d in (64, 128)}
    for d, change, out in (
        (64, {"delta": Delta("fa2_dot_do_o", FP32, threads=8)}, "dq"),
        (128, {"ds": SoftmaxGrad(FP32, scale_at="end")}, "dq"),
        (128, {"bwd_tiling": BwdTiling(128, 128, q_order="reverse", kv_order="reverse")}, "dv"),
    ):
        assert _agreement(by_d[d], **change)[out] < 1.0, change


def test_cudnn_crafted_inputs_are_reproduced():
    """studies.probes.cudnn_steps, recorded on the GPU: equal scores (l = n_k exactly, so only the LSE's form
    shows) and one max among equal keys (l's rounding shows the row sum's order), 38 launches; O and LSE of
    every one identical under the cuDNN model, and under the flash model for the flash backend (the
    probe's control)."""
    from flashsim import flash_forward
    from flashsim.crosscheck import to_bits
    from gpu.policies import sdpa_cudnn_policy, sdpa_flash_policy
    from studies.probes import cudnn_steps

    rec = Recording.load(CUDNN_DATA / "cudnn_steps.json")
    scale = 1.0 / np.sqrt(cudnn_steps.D)
    checked = 0
    for dtype in ("bf16", "fp16"):
        for case in cudnn_steps.cases(dtype):
            n_k = case["k"].shape[0]
            for backend, pol in (
                ("cudnn", sdpa_cudnn_policy(dtype, 64)),
                ("flash", sdpa_flash_policy(dtype, 64, n_q=cudnn_steps.ROWS, n_k=n_k)),
            ):
                r = flash_forward(case["q"], case["k"], case["v"], pol, sm_scale=scale)
                key = f"{backend}/{case['name']}"
                rec.verify(key + "/lse", np.asarray(r.lse, np.float32).reshape(-1).view(np.uint32))
                rec.verify(key + "/o", to_bits(np.asarray(r.o), dtype))
                checked += 1
    assert checked == 76 and len(rec.keys()) == 2 * checked  # every recorded output


def test_each_modelled_detail_of_cudnn_matters():
    """Not vacuous: FA2's thread row sums (rescale then add, (t0 + t2) + (t1 + t3)), an unfused update, the
    keys in reverse order, or blocks of 64 keys each lose identical outputs on the recorded cases."""
    from emufloat import FP32
    from flashsim.specs import RowSum, Tiling

    runs = [r for r in CUDNN if r.dtype == "bf16" and not r.causal]
    assert _agreement(runs, row_sum=RowSum("fa2_threads", FP32, fused=True))["lse"] < 0.99
    assert _agreement(runs, row_sum=RowSum("cudnn_threads", FP32))["lse"] < 1.0
    for tiling in (Tiling(128, 128, "reverse"), Tiling(128, 64, "forward")):
        assert _agreement(runs, tiling=tiling)["o"] < 0.99
