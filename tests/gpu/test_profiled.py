"""gpu.crosscheck.profiled: the CUDA kernels of a profiler's Chrome trace, read from the JSON alone."""

import pytest

from gpu.crosscheck.profiled import kernels_of_trace


def test_the_kernels_of_a_trace_in_launch_order_with_their_grids():
    trace = {
        "traceEvents": [
            {"cat": "cpu_op", "name": "aten::bmm", "ts": 1},
            {"cat": "kernel", "name": "void cublasLt::splitKreduce_kernel<32>", "ts": 30, "args": {"grid": [8, 1, 1]}},
            {
                "cat": "kernel",
                "name": "void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_64x64_nn_align1>",
                "ts": 20,
                "args": {"grid": [2, 4, 6], "block": [128, 1, 1]},
            },
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 19},
        ]
    }
    got = kernels_of_trace(trace)
    assert [k["name"].split("<")[0] for k in got] == ["void cutlass::Kernel2", "void cublasLt::splitKreduce_kernel"]
    assert got[0]["grid"] == [2, 4, 6] and got[0]["block"] == [128, 1, 1] and got[1]["block"] is None


@pytest.mark.parametrize("bad", [[], {"events": []}, {"traceEvents": 3}])
def test_what_is_not_a_chrome_trace_is_refused(bad):
    with pytest.raises(ValueError, match="trace: expected a Chrome trace"):
        kernels_of_trace(bad)
