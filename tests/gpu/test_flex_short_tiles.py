"""FlexAttention's short-query launches (Inductor's decoding template, K/V over SPLIT_KV programs, then Inductor's
combine), recorded on an H200 with what the combine reads (tests/data/flex/short_tiles.json, `python -m
studies.device.flex_short_tiles`): each split's M, L and acc as the template kernel stored them, O and the LSE,
re-derived from the cases' seeds through `flex_attention().policy_for` (the documented path's policy), bit for bit;
among them the document masks at 100 keys whose two 64-key tiles go to two splits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim.bits import to_bits
from flashsim.causal import KeyMask
from flashsim.recording import sha256_of
from gpu.crosscheck.kernels import flex_attention
from gpu.policies import flex_policy
from gpu.policies.flex_decoding import FlexDecodingCombine
from studies.device.flex_capture import case_inputs, mask_matrix

DATA = Path(__file__).resolve().parents[1] / "data" / "flex"
REC = json.loads((DATA / "short_tiles.json").read_text())
CASES = REC["cases"]


def _id(case: dict) -> str:
    return f"{case['mask']}_n{case['n']}_h{case['heads']}_d{case['d']}_{case['dtype']}"


def _policy(case: dict):
    """The policy `flex_attention().policy_for` derives from the launch (its kernel_info as recorded)."""
    mod = None if case["mask"] in ("none", "causal") else (lambda b, h, q, kv: q >= kv)  # not called: a stand-in
    launch = {
        "dtype": case["dtype"],
        "head_dim": case["d"],
        "batch_heads": case["heads"],
        "n_q": case["n"],
        "n_k": case["n"],
        "sm_count": REC["sm_count"],
        "causal": case["mask"] == "causal",
        "kernel_info": case["kernel_info"],
    }
    return flex_attention(mod).policy_for(launch).resolve()


def _run(case: dict, pol, monkeypatch) -> dict[str, str]:
    """O's and the LSE's digests, and those of every split's M, L and acc (stacked as the template stores them:
    split, head, row(, column)), from the case's seed."""
    splits: list = []
    combine = FlexDecodingCombine.combine

    def keep(self, results, policy, trace):
        splits.append(results)
        return combine(self, results, policy, trace)

    monkeypatch.setattr(FlexDecodingCombine, "combine", keep)
    x = case_inputs(case)
    mask = mask_matrix(case)
    causal = KeyMask(mask) if mask is not None else case["mask"] == "causal"
    r = fs.flash_forward(x["q"], x["k"], x["v"], pol, causal=causal, sm_scale=case["d"] ** -0.5)
    got = {"o": sha256_of(to_bits(r.o, ef.as_format(case["dtype"]))), "lse": sha256_of(to_bits(r.lse, ef.FP32))}
    for name, field in (("m", 1), ("l", 2), ("acc", 0)):
        per = np.stack([np.stack([np.asarray(s[field], np.float32) for s in head]) for head in splits], axis=1)
        got[name] = sha256_of(per.view(np.uint32))
    return got


def _want(case: dict) -> dict[str, str]:
    return case["digests"] | {k: case["splits"][k] for k in ("m", "l", "acc")}


def test_the_recording_says_how_and_where_it_was_made():
    assert REC["device"] == "NVIDIA H200" and REC["torch"].startswith("2.11") and REC["triton"] == "3.6.0"
    assert REC["command"] == "PYTHONPATH=. python -m studies.device.flex_short_tiles --out $OUT"
    assert {c["mask"] for c in CASES} == {"none", "causal", "document"} and len(CASES) == 7
    assert sum(c["mask"] == "document" for c in CASES) == 3


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_each_split_and_the_combine_are_the_policy_bit_for_bit(case, monkeypatch):
    """Every split's M, L and acc (a split without a key of a row: -inf, 0, 0), then O and the LSE."""
    pol = _policy(case)
    assert pol.tiling.kv_splits == case["kernel_info"]["SPLIT_KV"]
    assert _run(case, pol, monkeypatch) == _want(case)


def test_the_template_deals_a_block_masks_tiles_one_a_split():
    """100 keys over 8 splits: TILE_KV = 64 keys, the first two splits hold them, the others none; without a block
    mask (one sparse block of 2^30 keys) the first holds all."""
    doc = next(c for c in CASES if c["mask"] == "document")
    pol = _policy(doc)
    assert pol.combine.method == "flex_decoding_blocks" and pol.row_sum.order == "blocked_cols"
    from flashsim.orders import COMBINES

    assert (
        COMBINES.get("flex_decoding_blocks").ranges(100, 64, 8)
        == [range(0, 64), range(64, 100)] + [range(100, 100)] * 6
    )
    assert COMBINES.get("flex_decoding").ranges(100, 64, 8) == [range(0, 100)] + [range(100, 100)] * 7


@pytest.mark.parametrize("order", ["mma_sync_rows", "mma_sync_cols"])
def test_a_document_masks_row_sums_are_in_the_blocked_layout(order, monkeypatch):
    """The mask_mod's document-id loads keep its scores in Triton's blocked layout (one column a lane): summed as the
    mma.sync warps hold them, L is lost in its splits (and O and the LSE with it), M and acc are not."""
    case = next(c for c in CASES if c["mask"] == "document")
    pol = _policy(case)
    pol = dataclasses.replace(pol, row_sum=dataclasses.replace(pol.row_sum, order=order))
    got, want = _run(case, pol, monkeypatch), _want(case)
    assert got["m"] == want["m"] and got["acc"] == want["acc"]
    assert got["l"] != want["l"] and got["lse"] != want["lse"]


def test_what_is_not_modelled_is_refused():
    """A block mask over several sparse blocks (more than 128 keys: the template deals its tiles by the mask's
    block lists), a loading mask_mod in 16- or 64-row tiles (their layout not recorded), and a third split with
    keys (its place in the combine's reduction) are refused."""
    with pytest.raises(ValueError, match="modelled for one sparse block"):
        flex_policy("fp16", 64, 128, 64, 2, split_kv=8, n_k=200, block_mask=True)
    with pytest.raises(ValueError, match="modelled for 128-row tiles"):
        flex_policy("fp16", 64, 64, 64, 2, split_kv=4, n_k=64, block_mask=True, mask_loads=True)
    from flashsim.orders import COMBINES

    with pytest.raises(ValueError, match="third split"):
        COMBINES.get("flex_decoding_blocks").ranges(100, 32, 8)
