"""The gpu row engine of flashsim sweep: which cells it computes (the mapping, checked without a GPU), and on a
GPU (marked `gpu`, skipped without CUDA) a tiny sweep with --engine gpu equal to the same sweep on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("pyarrow")

import gpu.sweep_engine as se  # noqa: E402
from flashsim.sweep import parse_spec  # noqa: E402
from flashsim.sweep.engines import get_engine  # noqa: E402
from gpu import flash  # noqa: E402

KERNEL = "gpu.policies:kernel_policy"
FLASH = {
    "target": "gpu.policies:sdpa_flash_policy",
    "kwargs": {"head_dim": 64, "n_q": 1, "n_k": 128, "batch_heads": 1000},
}
EFFICIENT = {"target": "gpu.policies:sdpa_efficient_policy", "kwargs": {"head_dim": 64}}
CUDNN = {"target": "gpu.policies:sdpa_cudnn_policy", "kwargs": {"head_dim": 64}}


def _cells(policies, softmaxes=("standard",), **axes):
    data = {
        "rows": 4,
        "seeds": [1],
        "policies": list(policies),
        "softmaxes": list(softmaxes),
        "families": [{"name": "dense"}],
        **axes,
    }
    return parse_spec(data, "t.toml").cells()


def _plan(cell):
    return se.plan_cell(cell)


@pytest.fixture(autouse=True)
def _fresh_plans():
    se.plan_cell.cache_clear()
    yield
    se.plan_cell.cache_clear()


def test_our_kernels_at_their_tiles_run_on_the_gpu_every_variant_gpu_flash_accepts():
    cells = _cells(["triton_h100"], ["standard", "stabilised", "robust", "dithered", "cast_sum"])
    for cell in cells:
        found = _plan(cell)
        if cell.softmax.name in flash.SOFTMAX_IDS:  # as gpu.flash says now (cast_sum is being added)
            assert found == se.KernelPlan("triton", "bf16"), (cell.softmax.label, found)
        else:
            assert found == f"softmax {cell.softmax.label}: our kernels implement {', '.join(flash.SOFTMAX_IDS)}"


def test_the_kernels_policy_must_be_the_launch_of_the_head_dim_and_format():
    # triton_h100 is the 128x64 launch; at head_dim 128 the kernel runs 128x128 tiles with 8 warps
    (c128,) = _cells(["triton_h100"], head_dim=[128])
    assert _plan(c128).startswith("policy triton_h100 models no GPU launch at head_dim 128 with bf16 inputs")
    (k128,) = _cells(
        [{"target": KERNEL, "kwargs": {"dtype": "bf16", "head_dim": 128, "causal": False}}], head_dim=[128]
    )
    assert _plan(k128) == se.KernelPlan("triton", "bf16")
    # a causal launch's policy differs in its query tile only at d=64: still not the non-causal launch
    (causal,) = _cells([{"target": KERNEL, "kwargs": {"dtype": "bf16", "head_dim": 64, "causal": True}}])
    assert "models no GPU launch" in _plan(causal)
    # fp16 and the FP8 kernel with their own inputs; the FP8 kernel's policy on bf16 inputs stays on the CPU
    (f16,) = _cells(
        [{"target": KERNEL, "kwargs": {"dtype": "fp16", "head_dim": 64, "causal": False}}], formats=["fp16"]
    )
    assert _plan(f16) == se.KernelPlan("triton", "fp16")
    fp8 = {"target": KERNEL, "kwargs": {"dtype": "e4m3", "head_dim": 64, "causal": False}}
    (e4m3,) = _cells([fp8], formats=["e4m3fn"])
    assert _plan(e4m3) == se.KernelPlan("triton", "e4m3", promote_pv=True)  # the FP8 kernel's default
    plain = {"target": KERNEL, "kwargs": {**fp8["kwargs"], "promote_pv": False}}
    (e4m3_plain,) = _cells([plain], formats=["e4m3fn"])
    assert _plan(e4m3_plain) == se.KernelPlan("triton", "e4m3", promote_pv=False)
    (on_bf16,) = _cells([fp8])
    assert "models no GPU launch at head_dim 64 with bf16 inputs" in _plan(on_bf16)


def test_other_tiles_formats_head_dims_and_policies_stay_on_the_emulator():
    (bn32,) = _cells(["triton_h100"], block_n=[32])
    assert _plan(bn32) == "block_n 32: triton (bf16) runs K/V tiles of 64"
    (fp32,) = _cells(["triton_h100"], formats=["fp32"])
    assert _plan(fp32).startswith("format fp32: the GPU kernels take ")
    (d32,) = _cells(["triton_h100"], head_dim=[32])
    assert _plan(d32) == "head_dim 32: no GPU kernel of the engine runs it with bf16 inputs"
    for name in ("qiu_yao", "fa2", "baseline_bf16"):
        (cell,) = _cells([name])
        assert _plan(cell).startswith(f"policy {name} models no GPU launch"), name


def test_sdpa_backends_standard_softmax_unsplit_and_calibrated_torch_only(monkeypatch):
    monkeypatch.setattr(se, "_installed", lambda pkg: "2.11.0+cu130")
    flash_c, eff_c, cudnn_c = _cells([FLASH, EFFICIENT, CUDNN])
    assert _plan(flash_c) == se.KernelPlan("sdpa_flash", "bf16")
    assert _plan(eff_c) == se.KernelPlan("sdpa_efficient", "bf16")
    assert _plan(cudnn_c).startswith("policy gpu.policies:sdpa_cudnn_policy")  # N_q = 1 runs another cuDNN kernel
    for cell in _cells([FLASH], ["stabilised"]):
        assert _plan(cell) == "softmax stabilised: SDPA has the standard softmax only"
    # the model of a launch whose keys FA2 splits (one head, 4096 keys) is not what the engine launches
    split = {**FLASH, "kwargs": {"head_dim": 64, "n_q": 1, "n_k": 4096, "batch_heads": 1}}
    (cell,) = _cells([split], n_keys=[4096])
    assert "models no GPU launch" in _plan(cell)
    se.plan_cell.cache_clear()
    monkeypatch.setattr(se, "_installed", lambda pkg: "2.13.0+cpu")
    (cell,) = _cells([FLASH])
    assert _plan(cell) == (
        "sdpa_flash: modelled on another torch build than the 2.13.0+cpu here (gpu.policies.CALIBRATED_ON)"
    )


def test_the_entry_point_gives_the_engine_and_says_when_it_cannot_run():
    engine = get_engine("gpu")
    assert isinstance(engine, se.GpuEngine) and engine.name == "gpu" and engine.local_slots == 2
    (cell,) = _cells(["qiu_yao"])
    assert engine.why_not(cell) == _plan(cell)
    if not torch.cuda.is_available():
        assert engine.unavailable() == "torch sees no CUDA device"


# ---- on a GPU -----------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SPEC = """
name = "gpu-tiny"
rows = 300
chunk_rows = 150
seeds = [1]
policies = [
    "triton_h100",
    "qiu_yao",
    { target = "gpu.policies:sdpa_flash_policy", kwargs = { head_dim = 64, n_q = 1, n_k = 128, batch_heads = 1000 } },
    { target = "gpu.policies:sdpa_efficient_policy", kwargs = { head_dim = 64 } },
]
softmaxes = ["standard", "stabilised"]
n_keys = [128]
head_dim = [64]

[[families]]
name = "ties"
ties = [2, 3, 4]

[[families]]
name = "dense"
"""


@pytest.mark.gpu
@cuda
def test_a_sweep_on_the_gpu_equals_the_sweep_on_the_cpu(tmp_path):
    from flashsim.cli import main
    from flashsim.sweep import read_results

    spec = tmp_path / "tiny.toml"
    spec.write_text(SPEC)
    for engine in ("cpu", "gpu"):
        args = ["sweep", str(spec), "--out", str(tmp_path / engine), "--workers", "2", "--quiet", "--engine", engine]
        assert main(args + (["--confirm", "150"] if engine == "gpu" else [])) == 0
    cpu, gpu = (
        read_results(tmp_path / e).sort_by([("cell", "ascending"), ("row", "ascending")]) for e in ("cpu", "gpu")
    )
    assert cpu.num_rows == gpu.num_rows == 2 * 4 * 2 * 300
    for name in ("row", "o_err", "delta_err", "o_ulp", "delta_ulp", "cell"):
        a, b = np.asarray(cpu[name].to_pylist()), np.asarray(gpu[name].to_pylist())
        assert (a.view(np.uint64) == b.view(np.uint64)).all() if a.dtype == np.float64 else (a == b).all(), name
    engine = np.asarray(gpu["engine"].to_pylist())
    policy = np.asarray(gpu["policy"].to_pylist())
    assert set(engine[policy == "qiu_yao"]) == {"cpu"}
    on = policy != "qiu_yao"
    assert set(engine[on]) == {"gpu"} and bool(np.asarray(gpu["confirmed"])[on].all())
