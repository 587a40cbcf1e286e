"""gpu.crosscheck.profiled: the CUDA kernels of a profiler's Chrome trace, read from the JSON alone."""

import pytest

from emufloat.hw.cublas import kernel_model
from gpu.crosscheck.profiled import kernels_of_trace, short_name


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
    assert [k["name"] for k in got] == [
        "cutlass_75_tensorop_s1688gemm_bf16_64x64_nn_align1",
        "cublasLt::splitKreduce_kernel",
    ]
    assert got[0]["grid"] == [2, 4, 6] and got[0]["block"] == [128, 1, 1] and got[1]["block"] is None


@pytest.mark.parametrize("bad", [[], {"events": []}, {"traceEvents": 3}])
def test_what_is_not_a_chrome_trace_is_refused(bad):
    with pytest.raises(ValueError, match="trace: expected a Chrome trace"):
        kernels_of_trace(bad)


@pytest.mark.parametrize(
    "full, short",
    [
        (
            "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align1>"
            "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align1::Params)",
            "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align1",
        ),
        (
            "void cublasLt::splitKreduce_kernel<32, 16, int, float>(cublasLt::cublasSplitKParams<float>, float const*)",
            "cublasLt::splitKreduce_kernel",
        ),
        ("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT", "nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT"),
        (
            "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>(int)",
            "at::native::vectorized_elementwise_kernel",
        ),
    ],
)
def test_short_names_keep_what_names_the_kernel(full, short):
    assert short_name(full) == short


def test_a_split_launch_named_short_still_finds_its_model():
    names = [
        short_name(n)
        for n in (
            "void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_64x64_tn_align1>(x)",
            "void cublasLt::splitKreduce_kernel<32, 16>(y)",
        )
    ]
    assert kernel_model(names, splits=2).splits == 2
