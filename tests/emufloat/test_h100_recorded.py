"""emufloat's tensor-core models against tl.dot outputs recorded on an H100 (tests/data/h100).

The recordings keep the SHA-256 of the GPU's outputs (flashsim.recording) and the seeds of their inputs
(studies.probes.inputs): the inputs are regenerated and checked against their digests, the models' outputs
hashed and compared.  A mismatch names the device command that re-records the full bits.
"""

import functools
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat.hw import h100
from flashsim.recording import Recording
from studies.probes import inputs as probe_inputs

DATA = Path(__file__).parents[1] / "data" / "h100"
MMA = Recording.load(DATA / "mma.json")
TYPES = {
    "fp16": (np.float16, h100.WGMMA_FP16, (16, 32, 64, 128, 256)),
    "bf16": (ml_dtypes.bfloat16, h100.WGMMA_BF16, (16, 32, 64, 128, 256)),
    "e4m3": (ml_dtypes.float8_e4m3fn, h100.WGMMA_FP8, (32, 64, 128, 256)),
    "e5m2": (ml_dtypes.float8_e5m2, h100.WGMMA_FP8, (32, 64, 128, 256)),
}


@functools.cache
def _tiles(name: str) -> dict[str, np.ndarray]:
    """The stress tiles of one input type, regenerated from the recording's seed and checked against it."""
    x = probe_inputs.stress_tiles(MMA.meta["seed"], formats=(name,))
    MMA.verify_all(x)
    return x


@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3", "e5m2"])
def test_fused_block_model_is_bit_exact_on_recorded_tiles(name):
    dtype, model, ks = TYPES[name]
    data, n = _tiles(name), 0
    for k in ks:
        for variant in ("noc", "c"):
            key = f"{name}_K{k}_{variant}"
            a = data[key + "_a"].view(dtype)
            bt = data[key + "_bt"].view(dtype)
            c = data[key + "_c"].view(np.float32) if variant == "c" else None
            got = np.stack([ef.matmul(a[t], bt[t].T, model, None if c is None else c[t]) for t in range(len(a))])
            MMA.verify(key + "_d", got.view(np.uint32))
            n += got.size
    assert n >= 200_000 and n == sum(MMA.digest(k).size for k in MMA.keys(name) if k.endswith("_d"))


def test_tf32_model_is_bit_exact_with_truncated_inputs():
    """tl.dot(input_precision="tf32") on fp32 tiles: the hardware ignores each input's low 13 bits."""
    rec = Recording.load(DATA / "tf32.json")
    data = probe_inputs.tf32_tiles(rec.meta["seed"])
    rec.verify_all(data)
    n = 0
    for key in sorted(k[:-2] for k in rec.keys() if k.endswith("_d")):
        a = ef.quantize(data[key + "_a"].view(np.float32), ef.TF32, "rtz").astype(np.float32)
        bt = ef.quantize(data[key + "_bt"].view(np.float32), ef.TF32, "rtz").astype(np.float32)
        c = data[key + "_c"].view(np.float32) if key + "_c" in data else None
        got = np.stack([ef.matmul(a[t], bt[t].T, h100.WGMMA_TF32, None if c is None else c[t]) for t in range(len(a))])
        rec.verify(key + "_d", got.view(np.uint32))
        n += got.size
    assert n >= 200_000
    # rounding the inputs instead (as cvt.rna.tf32.f32 would) does not reproduce the GPU
    a = ef.quantize(data["K64_noc_a"].view(np.float32), ef.TF32, "rna").astype(np.float32)
    bt = ef.quantize(data["K64_noc_bt"].view(np.float32), ef.TF32, "rna").astype(np.float32)
    rna = np.stack([ef.matmul(a[t], bt[t].T, h100.WGMMA_TF32) for t in range(len(a))])
    assert not rec.matches("K64_noc_d", rna.view(np.uint32))


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
@pytest.mark.parametrize("with_c", [False, True])
def test_fp8_promotion_is_chunks_added_to_an_fp32_accumulator(dtype, with_c):
    """max_num_imprecise_acc=32: what the GPU matched on 1,179,648 dot products (tests/data/h100/verify.json,
    section dot, fp8_maxi32: c_in_fp32_accumulator 0 mismatches) is C plus each 32-product chunk, no C inside
    a chunk, added in float32; the preset must compute exactly that."""
    name = "e4m3" if dtype == ml_dtypes.float8_e4m3fn else "e5m2"
    data = _tiles(name)
    key = f"{name}_K256_{'c' if with_c else 'noc'}"
    a, bt = data[key + "_a"].view(dtype), data[key + "_bt"].view(dtype)
    c = data[key + "_c"].view(np.float32) if with_c else None
    for t in range(a.shape[0]):
        acc = c[t].copy() if with_c else np.zeros((64, 64), np.float32)
        for s in range(0, a.shape[2], 32):
            acc = acc + ef.matmul(a[t][:, s : s + 32], bt[t][:, s : s + 32].T, h100.WGMMA_FP8)
        got = ef.matmul(a[t], bt[t].T, h100.WGMMA_FP8_PROMOTED, None if c is None else c[t])
        assert np.array_equal(got.view(np.uint32), acc.view(np.uint32))
    verify = json.loads((DATA / "verify.json").read_text())["sections"]["dot"]["result"]["fp8_maxi32"]
    for fmt in ("e4m3", "e5m2"):
        r = verify[fmt]["c_in_fp32_accumulator"]
        assert r["compared"] > 500_000 and r["mismatch"] == 0


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", ["k16", "k64", "k8", "k8x4"])
def test_mma_sync_models(dtype, shape):
    """Ampere's mma.sync on the H100 (studies/probes/mma_sync.py): m16n8k16 (FlashAttention-2) rounds as the wgmma
    presets, m16n8k8 (the memory-efficient kernel) as 8-product blocks; one step D = A B + C, and chains over
    K = 64 and 32 from C = 0.  The k16 model fails the k8 chains (not vacuous)."""
    rec, z = _mma_sync()
    a, bt, c = (z[f"{dtype}_{shape}_{p}"] for p in ("a", "bt", "c"))
    np_dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    k16 = h100.WGMMA_BF16 if dtype == "bf16" else h100.WGMMA_FP16
    k8 = h100.MMA_K8_BF16 if dtype == "bf16" else h100.MMA_K8_FP16
    model = k8 if shape.startswith("k8") else k16
    av, bv = a.view(np_dt).astype(np.float32), bt.view(np_dt).astype(np.float32)
    cv = c.view(np.float32)
    one_step = shape in ("k16", "k8")
    got = np.stack([ef.matmul(av[t], bv[t].T, model, c=cv[t] if one_step else None) for t in range(len(av))])
    d = rec.bits(f"{dtype}_{shape}_d", got.view(np.uint32))  # the GPU's bits, proven by the digest
    if shape == "k8x4":
        wrong = sum(np.count_nonzero(ef.matmul(av[t], bv[t].T, k16).view(np.uint32) != d[t]) for t in range(len(av)))
        assert wrong > 0


@functools.cache
def _mma_sync() -> tuple[Recording, dict[str, np.ndarray]]:
    """mma_sync.json and its inputs, regenerated from its seed (the first tiles and chains the probe drew)."""
    rec = Recording.load(DATA / "mma_sync.json")
    z = probe_inputs.mma_sync_inputs(rec.meta["seed"], keep=(rec.meta["tiles"], rec.meta["chains"]))
    rec.verify_all(z)
    return rec, z
