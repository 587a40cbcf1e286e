"""Triton's tutorial at every tile its autotuner can pick (tests/data/tutorial_tiles, recorded on an H200): the
emulator under the tutorial's policy for the tiles that ran gives the GPU's bits (SHA-256 of O and the LSE), and the
attention check flags exactly the causal runs whose BLOCK_N exceeds BLOCK_M, where the tutorial's two loops add
some keys twice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import flashsim as fs
from flashsim.bounds import check_attention
from flashsim.crosscheck import to_bits
from flashsim.inputs import make_inputs
from flashsim.recording import sha256_of
from gpu.policies import tutorial_policy

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "tutorial_tiles" / "tutorial_tiles.json").read_text())
CASES = DATA["cases"]
QUICK = [c for c in CASES if c["n"] == 256]


def _label(c: dict) -> str:
    t = c["tiles"]
    how = "autotuned" if c["autotuned"] else "alone"
    mask = "causal" if c["causal"] else "full"
    return f"{t['BLOCK_M']}x{t['BLOCK_N']}w{t['num_warps']}_{how}_n{c['n']}_d{c['d']}_{mask}_{c['kind']}"


def test_the_recording_covers_every_tile_and_flags_only_block_n_above_block_m():
    tiles = {(c["tiles"]["BLOCK_M"], c["tiles"]["BLOCK_N"], c["tiles"]["num_warps"]) for c in CASES}
    assert {(bm, bn) for bm, bn, _w in tiles} == {(bm, bn) for bm in (64, 128) for bn in (32, 64, 128)}
    assert len(CASES) == 104 and all(c["check"]["identical"] == {"o": 1.0, "lse": 1.0} for c in CASES)
    flagged = {_label(c) for c in CASES if not c["check"]["attention"]}
    expected = {_label(c) for c in CASES if c["causal"] and c["tiles"]["BLOCK_N"] > c["tiles"]["BLOCK_M"]}
    assert flagged == expected and len(flagged) == 6
    assert any(c["autotuned"] for c in CASES if _label(c) in flagged)  # a user meets it without choosing a tile


def _replay(c: dict) -> None:
    x = make_inputs(c["kind"], c["n"], c["n"], c["d"], "fp16", c["seed"])
    q, k, v = (x[name][None] for name in "qkv")
    t = c["tiles"]
    pol = tutorial_policy(t["BLOCK_M"], t["BLOCK_N"], t["num_warps"])
    f = fs.flash_forward(q, k, v, pol, causal=c["causal"])
    assert sha256_of(to_bits(f.o, "fp16")[0]) == c["digests"]["o"]
    assert sha256_of(to_bits(f.lse, None)[0]) == c["digests"]["lse"]
    check = check_attention(q, k, v, f.o.astype(np.float64), f.lse, pol, causal=c["causal"])
    assert check.attention == c["check"]["attention"], str(check)


@pytest.mark.parametrize("case", QUICK, ids=[_label(c) for c in QUICK])
def test_the_gpus_bits_and_the_flag_from_the_seeds(case):
    _replay(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c["n"] > 256], ids=[_label(c) for c in CASES if c["n"] > 256])
def test_the_gpus_bits_and_the_flag_from_the_seeds_long(case):
    _replay(case)
