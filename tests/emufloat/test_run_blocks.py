"""Small calls run a kernel's serial block function directly, large ones the parallel kernel that runs the
same function block by block (`emufloat._arrays.run_blocks`): the two must agree bit for bit, traces
included, on inputs that end mid-block and hold NaNs, infinities and values that round to zero."""

import numpy as np
import pytest

import emufloat as ef
from emufloat import _arrays
from emufloat.hw import h100

N = 3 * _arrays.SERIAL_BELOW + 123  # several parallel blocks and a partial one


def _inputs(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(N).astype(np.float32) * np.float32(4.0)
    x[::97] *= np.float32(2.0**-130)  # FP32 subnormals, and zeros in narrow formats
    x[5], x[6], x[7] = np.nan, np.inf, -np.inf
    return x


def _columns(trace: ef.Trace) -> list[np.ndarray]:
    cols = []
    for c in trace.chunks:
        cols += [*c.operands, c.rounded, c.exact_hi, c.exact_lo, c.flags]
    return cols


CALLS = {
    "cast e4m3fn": lambda x, t: ef.quantize(x, "e4m3fn", trace=t),
    "cast bf16 sr": lambda x, t: ef.quantize(x, "bf16", ef.stochastic(seed=3), trace=t),
    "add bf16": lambda x, t: ef.add(ef.quantize(x, "bf16"), ef.quantize(x[::-1], "bf16"), trace=t),
    "fma fp32": lambda x, t: ef.fma(x, x[::-1], x, "fp32", trace=t),
    "exp2 bf16": lambda x, t: ef.exp2(x, "bf16", trace=t),
    "ex2.approx": lambda x, t: h100.ex2_approx(x, trace=t),
    "sum bf16": lambda x, t: ef.sum(x[: N // 8 * 8].reshape(-1, 8), "bf16", trace=t),
    "tree_sum": lambda x, t: ef.tree_sum(x[: N // 8 * 8].reshape(-1, 8), ef.ReductionTree.pairwise(8), "bf16", trace=t),
    "tree_max": lambda x, t: ef.tree_max(x[: N // 8 * 8].reshape(-1, 8), ef.ReductionTree.pairwise(8)),
    "matmul": lambda x, t: ef.matmul(
        ef.quantize(x[: 128 * 64].reshape(128, 64), "bf16"),
        ef.quantize(x[-64 * 128 :].reshape(64, 128), "bf16"),
        "h100_wgmma_bf16",
        trace=t,
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_serial_and_parallel_paths_agree(name, monkeypatch):
    call, x = CALLS[name], _inputs(1)
    parallel_trace, serial_trace = ef.Trace(), ef.Trace()
    parallel = call(x, parallel_trace)
    monkeypatch.setattr(_arrays, "SERIAL_BELOW", 1 << 62)  # every call takes the block function directly
    serial = call(x, serial_trace)
    assert parallel.dtype == serial.dtype and np.array_equal(parallel.view(np.uint8), serial.view(np.uint8)), (
        f"{name}: results differ"
    )
    got, want = _columns(serial_trace), _columns(parallel_trace)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8)), f"{name}: traces differ"
