"""A softmax variant of your own, in one file: how each K/V block picks the shift its exponentials are taken
against.

"offset" shifts by the block's row max plus a small constant, so that no key's P is exactly 1 (Qiu & Yao's
lean needs P = 1 at two or more keys).  Registered, its name works wherever a variant is named:
`flashsim.get_softmax`, the experiments and sweep specs.  Run: python -m examples.extend.softmax_variant
"""

from dataclasses import dataclass

import flashsim as fs
from flashsim import arith
from flashsim.analysis import experiments


@fs.register_softmax
@dataclass(frozen=True)
class OffsetSoftmax:
    """m = the block's row max + ``offset`` (natural-log units), rounded as the policy's max step rounds."""

    offset: float = 2.0**-5
    name: str = "offset"

    def block_max(self, s, valid, rowmax, m_old, ctx):
        shift = arith.constant(self.offset * ctx.units, ctx.spec)
        return arith.binary("add", rowmax, shift, ctx.spec, ctx.trace, ctx.label)


if __name__ == "__main__":
    rows = experiments.repeated_maxima_rows(400, seed=2)
    print(rows.description, "; policy qiu_yao (l and O in BF16)", sep="")
    for res in experiments.bias_rows(rows, "qiu_yao", ("standard", "offset", "cast_sum")):
        o = res.o
        print(
            f"{res.softmax:>9}: O's mean error {o.mean_error:+.2e} (95% CI {o.ci_low:+.2e} .. {o.ci_high:+.2e}), "
            f"{o.positive} up / {o.negative} down"
        )
