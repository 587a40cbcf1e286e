"""PyTorch's FlexAttention, compiled by Inductor on an H200 (tests/data/flex, `python -m studies.device.flex_capture`),
against `gpu.policies.flex_policy` through the documented path (a KernelRun with the kernel's own outputs, checked
by flashsim.crosscheck): no mask, causal, a sliding window and documents (a mask matrix), 1024 keys (whole tiles)
and 200 (not), head dims 64 and 128, bf16 and fp16, O and the natural-log LSE flex_attention returns; and the
backward's dQ, dK and dV re-derived from the cases' seeds against their digests."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim.bits import to_bits
from flashsim.causal import KeyMask, causal_offset
from flashsim.crosscheck import KernelRun, crosscheck
from flashsim.orders import KV_SCHEDULES
from flashsim.recording import sha256_of
from flashsim.specs import Op
from gpu.policies import flex_policy
from gpu.policies.flex_decoding import split_kv
from studies.device.flex_capture import case_inputs, mask_matrix

DATA = Path(__file__).resolve().parents[1] / "data" / "flex"
REC = json.loads((DATA / "flex.json").read_text())
FRESH = json.loads((DATA / "flex_check.json").read_text())
CASES = list(enumerate(REC["cases"]))
QUICK = [(i, c) for i, c in CASES if c["n"] == 200]


def _masking(case: dict):
    mask = mask_matrix(case)
    return KeyMask(mask) if mask is not None else case["mask"] == "causal"


def _emulated(case: dict, policy=None) -> dict[str, str]:
    x = case_inputs(case)
    pol = policy or flex_policy(case["dtype"], case["d"])
    r = fs.flash_forward(x["q"], x["k"], x["v"], pol, causal=_masking(case), sm_scale=case["d"] ** -0.5)
    return {"o": sha256_of(to_bits(r.o, ef.as_format(case["dtype"]))), "lse": sha256_of(to_bits(r.lse, ef.FP32))}


def _ids(item) -> str:
    i, c = item
    return f"{i}_{c['mask']}_n{c['n']}_d{c['d']}_{c['dtype']}"


def test_the_recording_says_how_it_was_made():
    assert REC["device"].startswith("NVIDIA H") and REC["torch"].startswith("2.11") and REC["triton"] == "3.6.0"
    assert "studies.device.flex_capture" in REC["command"]
    assert {c["mask"] for _, c in CASES} == {"none", "causal", "sliding", "document"} and len(CASES) == 32


@pytest.mark.parametrize("item", QUICK, ids=_ids)
def test_flex_forward_is_its_policy_bit_for_bit(item):
    _, case = item
    want = {name: case["digests"][name] for name in ("o", "lse")}
    assert _emulated(case) == want


@pytest.mark.slow
@pytest.mark.parametrize("item", [it for it in CASES if it[1]["n"] != 200], ids=_ids)
def test_flex_forward_at_whole_tiles_is_its_policy_bit_for_bit(item):
    _, case = item
    assert _emulated(case) == {name: case["digests"][name] for name in ("o", "lse")}


@pytest.mark.parametrize("index", [24, 31])
def test_the_documented_path_finds_flex_identical(index):
    """KernelRun (the kernel's bits, its mask as a matrix, the LSE as flex_attention returns it) and crosscheck."""
    case = REC["cases"][index]
    bits = np.load(DATA / "flex_bits.npz")
    x = case_inputs(case)
    run = KernelRun(
        q=x["q"],
        k=x["k"],
        v=x["v"],
        dtype=case["dtype"],
        causal=False,
        sm_scale=case["d"] ** -0.5,
        softmax="standard",
        policy=flex_policy(case["dtype"], case["d"]),
        outputs={"o": bits[f"case{index}/o"], "lse": bits[f"case{index}/lse"]},
        mask=mask_matrix(case),
    )
    report = crosscheck(run)
    assert all(c.identical == c.n for c in report.checks) and report.attention.attention


@pytest.mark.parametrize("item", CASES, ids=_ids)
def test_partial_blocks_first_as_torchs_block_mask_lists_them(item):
    """The schedule's partial and full blocks are the ones torch's create_block_mask listed (KV_IDX, FULL_KV_IDX,
    128 x 128 tiles): the partial ones in order, then the full ones."""
    _, case = item
    if case["mask"] == "none":
        return
    n, schedule = case["n"], KV_SCHEDULES.get("masked_first")
    offset = causal_offset(_masking(case), n, n)
    for qb in range(-(-n // 128)):
        rows = range(128 * qb, min(128 * qb + 128, n))
        got = schedule.blocks(rows, n, 128, 128, offset, True)
        partial = case["kv_indices"][qb][: case["kv_num_blocks"][qb]]
        full = case["full_kv_indices"][qb][: case["full_kv_num_blocks"][qb]]
        assert [(c.start // 128, m) for c, m in got] == [(j, True) for j in partial] + [(j, False) for j in full]


def test_without_the_split_fusion_or_the_block_order_flex_is_lost():
    """Mutations: the subtract fused in every block (no select in the way) loses causal and sliding-window cases, at
    whole tiles and not; the blocks in key order (full ones before the diagonal) loses the causal one."""
    for index, order_shows in ((4, True), (8, False), (24, False)):
        case = REC["cases"][index]
        want = {name: case["digests"][name] for name in ("o", "lse")}
        pol = flex_policy(case["dtype"], case["d"])
        assert _emulated(case, dataclasses.replace(pol, subtract=Op(ef.FP32, fused=True))) != want
        in_key_order = dataclasses.replace(pol, tiling=dataclasses.replace(pol.tiling, schedule="blocks"))
        assert (_emulated(case, in_key_order) != want) == order_shows


def _policy_of(case: dict, decoding: bool = True):
    """The case's policy from the tiles it reports; below 128 queries (Inductor's decoding template, unless not
    ``decoding``) with its SPLIT_KV, key count, whether a block mask ran and whether its mask_mod loads from a tensor
    (the document ids: `gpu.crosscheck.kernels.flex_config` reads it from the template's arguments, which these
    launches' records predate)."""
    info = case["kernel_info"]
    tiles = (info["BLOCK_M"], info["BLOCK_N"], info["num_warps"])
    kw = {}
    if decoding and case["n"] < 128:
        sms = FRESH["launch_common"]["sm_count"]
        kw = {"split_kv": split_kv(case["heads"], sms), "n_k": case["n"], "block_mask": case["mask"] != "none"}
        kw["mask_loads"] = case["mask"] == "document"
    return flex_policy(case["dtype"], case["d"], *tiles, **kw)


def test_fresh_launches_through_kernel_run_are_identical_or_refused():
    """106 fresh launches (`python -m studies.device.flex_check`: kernel_run, the policy from the tiles Inductor
    chose, masks as matrices, crosscheck on the device): every one the policy modelled then is bit-identical in O
    and LSE and is attention; the others are exactly the short-sequence configs (2 warps: Inductor's decoding
    template) the policy refused then.  All of those are modelled now and re-derived from their seeds
    (`test_short_sequence_launches_are_rederived`), the document masks at 100 keys (two 64-key tiles in two splits)
    among them."""
    assert FRESH["launch_common"]["device"] == "NVIDIA H200" and FRESH["launch_common"]["triton"] == "3.6.0"
    modelled = [c for c in FRESH["cases"] if "identical" in c["check"]]
    assert len(modelled) >= 75 and len(FRESH["cases"]) >= 100
    assert {c["mask"] for c in modelled} == {"none", "causal", "sliding", "document"}
    assert {c["heads"] for c in modelled} >= {1, 64} and max(c["n"] for c in modelled) == 8192
    for c in modelled:
        assert all(f == 1.0 for f in c["check"]["identical"].values()) and c["check"]["attention"]
        _policy_of(c)
    refused = [c for c in FRESH["cases"] if "error" in c["check"]]
    assert {c["kernel_info"]["num_warps"] for c in refused} == {2} and max(c["n"] for c in refused) < 128
    assert len(SHORT) == len(refused) == 28
    assert sum((c["mask"], c["n"], c["kernel_info"]["BLOCK_M"]) == ("document", 100, 128) for c in SHORT) == 3
    for c in refused:  # 64 or 128 rows on 2 warps: the decoding template needs the launch's split
        if c["kernel_info"]["BLOCK_M"] != 16:
            with pytest.raises(ValueError, match="split_kv: .* short-sequence configs"):
                _policy_of(c, decoding=False)


SHORT = [c for c in FRESH["cases"] if "error" in c["check"]]


def _short_id(c: dict) -> str:
    return f"{c['mask']}_n{c['n']}_h{c['heads']}_bm{c['kernel_info']['BLOCK_M']}_d{c['d']}_s{c['seed']}"


@pytest.mark.parametrize("case", SHORT, ids=_short_id)
def test_short_sequence_launches_are_rederived(case):
    """The decoding template's launches (16, 64 and 128 rows on 2 warps, K/V over SPLIT_KV splits and Inductor's
    combine), O and LSE bit for bit; the 16-row ones also as one split with the regular template's row sums."""
    want = {name: case["digests"][name] for name in ("o", "lse")}
    pol = _policy_of(case)
    method = "flex_decoding" if case["mask"] == "none" else "flex_decoding_blocks"
    assert pol.tiling.kv_splits == split_kv(case["heads"], 132) > 1 and pol.combine.method == method
    assert _emulated(case, pol) == want
    if case["kernel_info"]["BLOCK_M"] == 16:
        assert _emulated(case, _policy_of(case, decoding=False)) == want


def _short_pick(block_m: int, d: int) -> dict:
    return next(c for c in SHORT if c["kernel_info"]["BLOCK_M"] == block_m and c["d"] == d and c["mask"] == "none")


@pytest.mark.parametrize(
    ("block_m", "d", "change"),
    [
        (64, 128, "mma_sync_rows"),  # warps on columns (alternate 8-column groups) summed as on rows
        (128, 64, "mma_sync_cols"),  # warps on rows summed as on columns
        (64, 64, "fused"),  # 64 rows over 64 keys (whole tiles to flashsim): the template's select stands between
    ],
)
def test_without_the_decoding_layout_or_the_unfused_subtract_short_launches_are_lost(block_m, d, change):
    case = _short_pick(block_m, d)
    pol = _policy_of(case)
    if change == "fused":
        pol = dataclasses.replace(pol, subtract=Op(ef.FP32, fused=True))
    else:
        assert pol.row_sum.order != change
        pol = dataclasses.replace(pol, row_sum=dataclasses.replace(pol.row_sum, order=change))
    assert _emulated(case, pol) != {name: case["digests"][name] for name in ("o", "lse")}


def test_the_decoding_launch_reaches_the_policy_through_kernel_run():
    """policy_for: below 128 queries the launch's SPLIT_KV (from the generated source, else its heads and SMs), its
    keys, whether a block mask ran and whether its mask_mod loads from a tensor reach the policy; a block mask over
    more than one sparse block (128 keys) is refused."""
    from gpu.crosscheck.kernels import flex_attention

    info = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 2, "num_stages": 1}
    launch = {"dtype": "fp16", "head_dim": 64, "batch_heads": 32, "n_q": 100, "n_k": 100, "sm_count": 132}
    ref = flex_attention().policy_for(launch | {"kernel_info": info})
    assert ref.kwargs["split_kv"] == 8 and ref.kwargs["block_mask"] is False
    assert ref.resolve().tiling.kv_splits == 8
    assert flex_attention().policy_for(launch | {"kernel_info": info | {"SPLIT_KV": 3}}).kwargs["split_kv"] == 3
    masked = flex_attention(lambda b, h, q, kv: q >= kv).policy_for(launch | {"kernel_info": info})
    assert masked.kwargs["block_mask"] is True and masked.kwargs["mask_loads"] is False
    assert masked.resolve().combine.method == "flex_decoding_blocks"
    loads = flex_attention(lambda b, h, q, kv: q >= kv).policy_for(
        launch | {"kernel_info": info | {"mask_loads": True}}
    )
    assert loads.resolve().row_sum.order == "blocked_cols"
    long = flex_attention(lambda b, h, q, kv: q >= kv).policy_for(launch | {"n_k": 200, "kernel_info": info})
    with pytest.raises(ValueError, match="modelled for one sparse block"):
        long.resolve()


SMALL_FRESH = [c for c in FRESH["cases"] if "identical" in c["check"] and c["heads"] * c["n"] ** 2 <= 2**20]


@pytest.mark.parametrize("case", SMALL_FRESH[:4], ids=lambda c: f"{c['mask']}_n{c['n']}_h{c['heads']}_s{c['seed']}")
def test_fresh_launch_bits_are_rederived_from_their_seeds(case):
    assert _emulated(case, _policy_of(case)) == {name: case["digests"][name] for name in ("o", "lse")}


@pytest.mark.slow
@pytest.mark.parametrize("case", SMALL_FRESH[4:], ids=lambda c: f"{c['mask']}_n{c['n']}_h{c['heads']}_s{c['seed']}")
def test_more_fresh_launch_bits_are_rederived_from_their_seeds(case):
    assert _emulated(case, _policy_of(case)) == {name: case["digests"][name] for name in ("o", "lse")}


# ---- the backward ------------------------------------------------------------------------------------------
#: cases whose delta kernel Inductor's autotuner ran at XBLOCK=1 (a row over 2 warps); the others at XBLOCK=32.
#: The pick holds for a compiled delta kernel (dtype, rows, head dim) within a run: here fp16 with 1024 rows and
#: head dim 128, bf16 with 600 rows and 128 (another recording of the same cases took 1 for bf16, 600 rows and 64
#: instead).  Every case is reproduced by exactly its pick, or, where delta's last bits do not reach the
#: gradients, by both.
DELTA_XBLOCK1 = {3, 7, 11, 15, 18, 22, 26, 30}


def _backward(case: dict, policy=None, **kw) -> dict[str, str]:
    """Digests of dq, dk, dv re-derived from the case's seed: the forward under the policy for O and the kernel's
    base-2 LSE (`kernel_lse`), then the backward."""
    x = case_inputs(case)
    pol = policy or _bwd_policy(case)
    args = dict(causal=_masking(case), sm_scale=case["d"] ** -0.5)
    raw = dataclasses.replace(pol, lse=dataclasses.replace(pol.lse, form="mul_add"))  # stops at the kernel's LSE
    f = fs.flash_forward(x["q"], x["k"], x["v"], raw, **args)
    kw.setdefault("kernel_lse", f.lse)
    b = fs.flash_backward(x["q"], x["k"], x["v"], f.o, f.lse, x["do"], pol, **args, **kw)
    fmt = ef.as_format(case["dtype"])
    return {name: sha256_of(to_bits(g, fmt)) for name, g in zip(("dq", "dk", "dv"), b, strict=True)}


def _bwd_policy(case: dict, other_xblock: bool = False):
    """The case's policy with delta as its launch summed it (``other_xblock``: as the other pick sums it)."""
    return flex_policy(
        case["dtype"], case["d"], delta_xblock=1 if (case["index"] in DELTA_XBLOCK1) != other_xblock else 32
    )


def _want(case: dict) -> dict[str, str]:
    return {name: case["digests"][name] for name in ("dq", "dk", "dv")}


BWD_CASES = [(i, {**c, "index": i}) for i, c in CASES]


@pytest.mark.parametrize("item", BWD_CASES, ids=_ids)
def test_flex_backward_is_its_policy_bit_for_bit(item):
    """dQ, dK and dV of every recorded case, bit for bit, with delta's XBLOCK the launch took."""
    _, case = item
    assert _backward(case) == _want(case)


def test_the_backward_reads_the_kernels_lse_and_recomputes_it_when_not_given():
    """flash_backward(o, lse) as flash_forward returns them: the natural LSE does not determine the kernel's base-2
    one, so the backward recomputes it (the same bits); handed the natural LSE instead, it is lost."""
    case = {**REC["cases"][16], "index": 16}
    x, pol = case_inputs(case), _bwd_policy(case)
    f = fs.flash_forward(x["q"], x["k"], x["v"], pol, sm_scale=0.125)
    b = fs.flash_backward(x["q"], x["k"], x["v"], f.o, f.lse, x["do"], pol, sm_scale=0.125)
    assert {n: sha256_of(to_bits(g, ef.BF16)) for n, g in zip(("dq", "dk", "dv"), b, strict=True)} == _want(case)
    assert _backward(case, pol, kernel_lse=f.lse) != _want(case)


@pytest.mark.parametrize(
    ("index", "change"),
    [
        (4, "order"),  # causal: each walk's blocks in plain order (full blocks before the diagonal partial one)
        (15, "order"),  # documents
        (11, "fused"),  # x one FMA where the mask's select stands between the multiply and the subtract
        (17, "fused"),  # ... or the bounds check's, in a launch not of whole tiles
        (3, "unfused"),  # x a multiply and a subtraction where ptxas contracts them
        (3, "xblock"),  # delta summed as the other XBLOCK sums it
        (16, "xblock"),
    ],
)
def test_without_flexs_block_order_fusion_or_delta_tree_the_backward_is_lost(index, change):
    case = {**REC["cases"][index], "index": index}
    pol = _bwd_policy(case, other_xblock=change == "xblock")
    rec = pol.recompute
    if change == "order":
        pol = dataclasses.replace(pol, bwd_tiling=fs.specs.BwdTiling(64, 128))
    if change in ("fused", "unfused"):
        pol = dataclasses.replace(pol, recompute=dataclasses.replace(rec, fused=change == "fused", unfused_in=()))
    assert _backward(case, pol) != _want(case)


def test_delta_follows_the_layout_of_the_pick_the_launch_reports():
    """Triton's blocked layout for delta's [XBLOCK, d] tile: at XBLOCK 32 (8 warps) 8 values a lane, the tree of
    our kernels' delta; at XBLOCK 1 (2 warps) a row over 64 lanes; at XBLOCK 8 on 2 warps, as 25 fresh launches
    reported it (tests/data/flex/flex_check_bwd.json, d 64 and 128, bf16 and fp16, every one identical in O, LSE,
    dQ, dK and dV on the device), 8 values a lane: at d 64 the tree of XBLOCK 32; at XBLOCK 8 on 4 warps 4 values a
    lane at d 64 (derived by the same rule, no launch has taken it).  The launch's own report reaches the policy."""
    from emufloat.hw import h100
    from flashsim.forms import TritonBlocked, triton_blocked_delta
    from gpu.crosscheck.kernels import flex_attention

    assert triton_blocked_delta(32, 8, 64) == (8, 8) and triton_blocked_delta(32, 8, 128) == (8, 16)
    assert triton_blocked_delta(1, 2, 64) == (1, 64) and triton_blocked_delta(1, 2, 128) == (2, 64)
    assert triton_blocked_delta(8, 4, 64) == (4, 16) and triton_blocked_delta(8, 4, 128) == (8, 16)
    assert triton_blocked_delta(8, 2, 64) == (8, 8) and triton_blocked_delta(8, 2, 128) == (8, 16)
    bwd = json.loads((DATA / "flex_check_bwd.json").read_text())["cases"]
    xblock8 = [c for c in bwd if c.get("launch", {}).get("kernel_info", {}).get("delta_xblock") == 8]
    assert len(xblock8) == 25 and {c["launch"]["kernel_info"]["delta_num_warps"] for c in xblock8} == {2}
    assert {c["d"] for c in xblock8} == {64, 128}
    assert all(set(c["check"]["identical"].values()) == {1.0} for c in xblock8)
    for d in (64, 128):
        chunk, threads = triton_blocked_delta(32, 8, d)
        assert TritonBlocked.tree(d, chunk, threads) == h100.tl_sum_loaded_16bit(d)
    assert TritonBlocked.tree(64, 1, 64) != TritonBlocked.tree(64, 4, 16)
    with pytest.raises(ValueError, match="num_warps: expected a power of two"):
        triton_blocked_delta(8, 3, 64)
    with pytest.raises(ValueError, match="delta_xblock: without delta_num_warps"):
        flex_policy("bf16", 64, delta_xblock=16)
    launch = {"dtype": "bf16", "head_dim": 64, "kernel_info": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4}}
    launch["kernel_info"] |= {"delta_xblock": 8, "delta_num_warps": 2}
    ref = flex_attention().policy_for(launch)
    assert ref.kwargs["delta_xblock"] == 8 and ref.kwargs["delta_num_warps"] == 2
    assert ref.resolve().delta.chunk == 8


def test_a_launch_whose_tiles_no_source_says_is_refused_not_guessed(monkeypatch):
    """The tiles come from the source Inductor generates when it compiles: a launch it compiled before in this
    process keeps the tiles read then; one it never compiled here (compiled elsewhere, or run eager past the
    recompile limit) is refused with what to do, not checked against default tiles."""
    torch = pytest.importorskip("torch")
    import torch._inductor.utils as inductor_utils

    from gpu.crosscheck.kernels import flex_attention

    template = "triton_tem_fused_flex_attention_0 'BLOCK_M': 64, 'BLOCK_N': 32, num_stages=2, num_warps=4, "
    template += "triton_meta={'signature': {'arg_Q'"
    sources = [[template]]

    def fake_run(fn, q, k, v, **kwargs):
        aux = type("Aux", (), {"lse": torch.zeros(q.shape[:-1])})()
        return (torch.zeros_like(q), aux), sources.pop(0) if sources else []

    monkeypatch.setattr(inductor_utils, "run_and_get_code", fake_run)
    kernel = flex_attention()
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    first = kernel(q, q, q, False, 0.125)[2]
    assert first == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    assert kernel(q, q, q, False, 0.125)[2] == first  # cached: no new source, the tiles read when it compiled
    with pytest.raises(RuntimeError, match="generated no FlexAttention kernel for this launch"):
        kernel(q[:, :, :8], q[:, :, :8], q[:, :, :8], False, 0.125)
