"""A device of your own, in one file: what a made-up GPU "X1" computes, registered where policies find it.

MMA-Sim's lesson: a device is a row of parameters, not a code path.  X1's tensor core fuses blocks of 32
products with 26 alignment bits and rounds to nearest; its exp2 unit is correctly rounded; its kernels sum a
block of P pairwise and normalise by a reciprocal and a multiply.  Each piece registers under a name; a policy
names them; nothing in the packages changes.  Run: python -m examples.extend.device
"""

import dataclasses

import numpy as np

import emufloat as ef
import flashsim as fs
from flashsim import arith
from flashsim.orders import DIVISIONS, ROW_SUMS, Division
from flashsim.specs import Dot, Func, Norm, RowSum

#: the tensor core, as accumulation parameters
X1_MMA = ef.FusedBlock(width=32, align_bits=26, final_rounding=ef.Rounding("rne"), name="x1_mma_bf16")
ef.accum.register(X1_MMA)


def x1_ex2(x, trace=None, label=""):
    """The exp2 unit: 2**x correctly rounded into FP32."""
    return ef.exp2(np.asarray(x, np.float32), ef.FP32, trace=trace, label=label)


fs.register_function(fs.FunctionModel("x1_ex2", "exp", "2", "X1's exp2: correctly rounded", x1_ex2))


class PairwiseBlockSum(arith.BlockSumOrder):
    """l: each block of P summed pairwise in FP32, then l = l * alpha + s."""

    name, doc = "x1_pairwise", "each block summed pairwise in FP32"

    def block_sum(self, p, spec, tile, trace, label):
        return arith.tree_rowsum(p, ef.ReductionTree.pairwise(p.shape[-1]), spec, trace, label)


class ReciprocalMultiply(Division):
    """O = acc * fl32(1 / l)."""

    name, doc, methods, hardware = "x1_rcp", "1/l correctly rounded to FP32, then a multiply", ("reciprocal",), True

    def reciprocal(self, l, spec, trace, label):
        return ef.div(np.float32(1), np.asarray(l, np.float32), ef.FP32, trace=trace, label=label)


ROW_SUMS.register(PairwiseBlockSum(), replace=True)
DIVISIONS.register(ReciprocalMultiply(), replace=True)

#: a kernel on X1: the project's Triton kernel's steps, with X1's units
X1 = fs.register_policy(
    dataclasses.replace(
        fs.get_policy("triton_h100"),
        name="x1",
        note="the Triton kernel's steps on the made-up X1",
        scores=Dot(ef.BF16, "x1_mma_bf16"),
        exp=Func("x1_ex2", ef.FP32),
        row_sum=RowSum("x1_pairwise", ef.FP32),
        pv=Dot(ef.BF16, "x1_mma_bf16", into_acc=True),
        normalize=Norm("reciprocal", "x1_rcp", ef.FP32),
    ),
    replace=True,
)

if __name__ == "__main__":
    print(str(X1).split("  backward:")[0])
    rows = fs.analysis.experiments.repeated_maxima_rows(500, seed=1)
    print(rows.description)
    for res in fs.analysis.experiments.bias_rows(rows, "x1", ("standard", "cast_sum")):
        o = res.o
        print(
            f"{res.softmax:>9}: O's mean error {o.mean_error:+.2e} (95% CI {o.ci_low:+.2e} .. {o.ci_high:+.2e}), "
            f"{o.positive} up / {o.negative} down, sign test p = {o.sign_p:.2g}"
        )
