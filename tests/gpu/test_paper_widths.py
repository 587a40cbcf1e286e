"""Qiu & Yao's pipeline recorded on an H200 at key counts that are not whole 16-byte vectors, over 1 to 8 heads
(tests/data/paper_widths, `python -m studies.device.paper_widths`): PyTorch sums each row of P as vectors counted
from where the row starts in the launch's (heads, rows, keys) tensor, and the emulator gives the GPU's LSE (which
holds the row sums, stored in bf16) in every case; O and the gradients differ only where cuBLAS leaves its sm90
kernels, and the cross-check says so for every such case."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim.bits import to_bits
from flashsim.recording import sha256_of
from gpu.policies import QIU_YAO, cublas_alignment
from gpu.policies.qiu_yao import qiu_yao_policy_for
from studies.device.paper_widths import case_inputs, case_softmax

DATA = Path(__file__).resolve().parents[1] / "data" / "paper_widths" / "paper_widths.json"
REC = json.loads(DATA.read_text())
CASES = REC["cases"]
QUICK = [c for c in CASES if c["n"] <= 400 and c["heads"] <= 3][:10]


def _lse_digest(case: dict) -> str:
    x = case_inputs(case)
    r = fs.flash_forward(x["q"], x["k"], x["v"], QIU_YAO, causal=case["causal"], softmax=case_softmax(case))
    return sha256_of(to_bits(r.lse, ef.FP32))


def test_the_recording_says_how_it_was_made():
    assert REC["device"].startswith("NVIDIA H") and REC["torch"].startswith("2.11")
    assert "studies.device.paper_widths" in REC["command"]
    assert len(CASES) == 112 and all(c["identical"]["lse"] == 1.0 for c in CASES)
    assert {c["heads"] for c in CASES} == {1, 2, 3, 5, 8} and any(c["n"] % 4 for c in CASES)


@pytest.mark.parametrize("case", QUICK, ids=lambda c: f"n{c['n']}_h{c['heads']}_d{c['d']}_s{c['seed']}")
def test_lse_of_rows_off_the_vector_boundary_is_the_gpus(case):
    assert _lse_digest(case) == case["digests"]["lse"]


@pytest.mark.slow
def test_lse_is_the_gpus_in_every_recorded_case():
    missed = [(c["n"], c["heads"], c["seed"]) for c in CASES if _lse_digest(c) != c["digests"]["lse"]]
    assert not missed


def test_flashsims_torch_row_sum_is_the_launchs_along_each_rows_own_tree():
    """flashsim's `torch_cuda` row sum of one head's block (or a few of its rows, as the stepper holds them) is
    `torch_cuda.row_sums` of the launch's whole (heads x rows, keys) tensor, the model held to the GPU on 136
    launches (tests/gpu/test_paper_pipeline.py); summed as if each head were a launch of its own, rows of heads
    that start off a 16-byte boundary change."""
    from emufloat.hw import torch_cuda
    from flashsim.orders import ROW_SUMS, BlockPlace
    from flashsim.specs import RowSum

    heads, rows, n = 3, 37, 150
    p = np.random.default_rng(5).random((heads, rows, n)).astype(np.float32)
    want = torch_cuda.row_sums(p.reshape(heads * rows, n)).reshape(heads, rows)
    order, spec = ROW_SUMS.get("torch_cuda"), RowSum("torch_cuda", ef.FP32)
    for h in range(heads):
        got = order.block_sum(p[h], spec, BlockPlace(512, n, h, heads, rows), None, "l")
        assert np.array_equal(np.asarray(got, np.float32), want[h])
    picked = np.array([3, 4, 30])
    some = order.block_sum(p[1][picked], spec, BlockPlace(512, n, 1, heads, rows, picked), None, "l")
    assert np.array_equal(np.asarray(some, np.float32), want[1][picked])
    alone = np.asarray(order.block_sum(p[1], spec, BlockPlace(512, n), None, "l"), np.float32)
    assert not np.array_equal(alone, want[1])


def test_every_case_that_differs_is_said_to_by_the_cross_check():
    """Each case with an output that is not bit-identical has a tile that is not a whole 16-byte row of bf16, and
    the launch check names it; at those tiles cuBLAS ran CUTLASS sm75/sm80 kernels (studies/device/cublas_gemms)."""
    for c in CASES:
        launch = {"n_q": c["n"], "n_k": c["n"], "head_dim": c["d"], "batch_heads": c["heads"]}
        if min(c["identical"].values()) < 1.0:
            assert cublas_alignment(QIU_YAO, launch) is not None
    assert cublas_alignment(QIU_YAO, {"n_q": 640, "n_k": 640, "head_dim": 64}) is None


FRESH_5 = json.loads((DATA.parents[1] / "fresh_check" / "fresh_5.json").read_text())
#: a launch of 129 keys (tiles of 129: CUTLASS kernels, some split over K) with its GEMM table, one head
LAUNCH_129 = next(
    c
    for c in FRESH_5["cases"]
    if c["kernel"] == "paper" and c["n"] == 129 and c["causal"] and c["softmax"] == "standard"
)


def _launch_policy(case: dict) -> fs.Policy:
    return qiu_yao_policy_for(case["launch"]).resolve()


def test_the_launchs_gemm_table_picks_each_products_model_by_its_shape():
    from emufloat.hw import cublas, h100
    from gpu.crosscheck.upstream import paper_kernel

    launch = LAUNCH_129["launch"]
    ref = paper_kernel(None).policy_for(launch)
    assert ref.target == "gpu.policies:qiu_yao_policy" and ref.kwargs["gemms"]
    pol = ref.resolve()
    assert pol.name == "qiu_yao_launch" and pol.scores.model is pol.dp.model and pol.dv.dot.model is pol.dk.dot.model
    scores = pol.scores.model.model_for((129, 129, 128))  # grid z 2 with splitKreduce_kernel: two slices of K
    assert (scores.step, scores.tile, scores.splits) == (h100.MMA_K8_BF16, 32, 2)
    assert pol.pv.model.model_for((129, 128, 129)).splits == 2 and pol.dq.dot.model is pol.pv.model
    with pytest.raises(ValueError, match=r"no model for a product of shape 512x129x128 \(M x N x K\)"):
        pol.scores.model.model_for((512, 129, 128))
    # without a table: the plain policy, and the launch check says what it leaves out
    bare = {**launch, "kernel_info": {"stable": False}}
    assert paper_kernel(None).policy_for(bare) == fs.PolicyRef("qiu_yao")
    assert cublas_alignment(QIU_YAO, bare) is not None and cublas_alignment(pol, launch) is None
    assert cublas.kernel_model(["nvjet_sm90_tst_64x64_64x13_2x1_v_bz_TNT"]) is h100.WGMMA_BF16


def test_a_product_shape_the_launch_did_not_report_is_refused():
    pol = _launch_policy(LAUNCH_129)
    x = np.random.default_rng(0).standard_normal((3, 130, 128)).astype(np.float32)
    with pytest.raises(ValueError, match=r"no model for a product of shape 130x130x128"):
        fs.flash_forward(x[0], x[1], x[2], pol)


def test_rows_emulated_alone_take_the_model_of_the_launchs_tile():
    """A subset of a Q block's rows is a product of fewer rows: the model is still the one cuBLAS ran for the
    whole tile (another shape would be refused, or take another kernel's model)."""
    from studies.device.fresh_check import case_inputs

    pol = _launch_policy(LAUNCH_129)
    x = case_inputs(LAUNCH_129)
    whole = fs.flash_forward(x["q"][0], x["k"][0], x["v"][0], pol, causal=True)
    some = fs.step_rows(x["q"][0], x["k"][0], x["v"][0], pol, rows=[5, 100], causal=True, trace=False).result
    assert np.array_equal(to_bits(some.o, ef.BF16), to_bits(whole.o[[5, 100]], ef.BF16))
