"""Your kernel's policy, in one file: how it rounds at every step, as a value flashsim can run and trace.

"my_fp16_kernel" is an FP16 flash-attention forward: FP16 inputs and P, FP32 scores and accumulators summed
one product at a time, the natural exp and log as CUDA's libdevice computes them, l summed left to right,
128 x 64 tiles.  Registered here, its name works in the API; to make it work on the command line and in
sweep specs too, publish it from your package's pyproject.toml:

    [project.entry-points."flashsim.policies"]
    my_fp16_kernel = "my_package.policy:MY_KERNEL"

Run: python -m examples.extend.kernel_policy
"""

import emufloat as ef
import flashsim as fs
from flashsim.analysis.report import format_report
from flashsim.examples import builtin_row
from flashsim.specs import Dot, Func, Mask, Norm, Op, RowSum, Scale, Tiling

ACC = ef.Sequential(ef.FP32)

MY_KERNEL = fs.register_policy(
    fs.Policy(
        name="my_fp16_kernel",
        note="an FP16 kernel: FP32 accumulators summed in order, libdevice's expf and logf",
        scores=Dot(ef.FP16, ACC),
        scale=Scale("scores", ef.FP32),
        mask=Mask(),
        max=Op(ef.FP32),
        subtract=Op(ef.FP32),
        exp=Func("libdevice_expf", ef.FP32),
        row_sum=RowSum("sequential", ef.FP32),
        p_cast=Op(ef.FP16),
        pv=Dot(ef.FP16, ACC, into_acc=True),
        rescale=Op(ef.FP32),
        o_accum=Op(ef.FP32),
        normalize=Norm("divide", "ieee", ef.FP32),
        output=Op(ef.FP16),
        lse=Func("libdevice_logf", ef.FP32),
        tiling=Tiling(128, 64),
    ),
    replace=True,
)

if __name__ == "__main__":
    print(MY_KERNEL)
    ex = builtin_row()
    q, k, v = (ef.quantize(x, ef.FP16) for x in (ex.q, ex.k, ex.v))
    analyses = [
        fs.analyse_row(q, k, v, "my_fp16_kernel", row=ex.row, softmax=sm, block_n=ex.block_n)
        for sm in ("standard", "cast_sum")
    ]
    print(format_report(analyses))
