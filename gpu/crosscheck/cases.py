"""Attention inputs by seed, for the GPU recordings and the emulator cross-check (numpy only).

A `Case` names everything that decides the kernel's result: shapes, dtype, causal, softmax
variant, input kind, seed and (FP8) whether P V's partial sums are promoted to FP32.  `inputs` builds
q, k, v (and dO) from the seed with numpy and rounds them to the dtype (RNE, as `torch.Tensor.to` does),
so the CPU regenerates exactly the tensors the GPU ran on; the kinds are `flashsim.inputs`' (`repeated`
with pairs of identical keys).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

import emufloat as ef
from flashsim.inputs import draw_head

from ..configs import kernel_format

KINDS = ("random", "repeated", "sink", "large", "tiny")  # the kinds of the recorded grid, in the grid's order
SOFTMAXES = ("standard", "stabilised", "robust")  # the variants of the original recorded grid


@dataclass(frozen=True)
class Case:
    n_q: int
    n_k: int
    d: int
    dtype: str  # 'bf16', 'fp16' or 'e4m3' (the FP8 forward)
    causal: bool
    softmax: str
    kind: str
    seed: int
    promote_pv: bool = False  # FP8: the kernel's PROMOTE_PV (recordings made before it existed ran without)

    @property
    def key(self) -> str:
        return (
            f"{self.dtype}_d{self.d}_q{self.n_q}_k{self.n_k}_{'causal' if self.causal else 'full'}_"
            f"{self.softmax}_{self.kind}_s{self.seed}{'_pv32' if self.promote_pv else ''}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def batch(
    kind: str, dtype: str, shape: tuple[int, int, int, int], seed: int, n_k: int | None = None
) -> dict[str, np.ndarray]:
    """q, k, v, dO of shape (B, H, N, d) (k, v with `n_k` rows if given): every head drawn as
    `inputs` draws one, from one generator seeded with `seed`; float32 arrays of dtype values."""
    b, h, nq, d = shape
    rng = np.random.default_rng(seed)
    heads = [draw_head(rng, kind, nq, nq if n_k is None else n_k, d) for _ in range(b * h)]
    fmt = kernel_format(dtype)
    return {
        name: ef.quantize(np.stack([hd[name] for hd in heads]), fmt)
        .astype(np.float32)
        .reshape(b, h, *heads[0][name].shape)
        for name in ("q", "k", "v", "do")
    }


def inputs(case: Case) -> dict[str, np.ndarray]:
    """q, k, v, do of a case as float32 arrays holding dtype values, shapes (1, 1, N, d)."""
    return batch(case.kind, case.dtype, (1, 1, case.n_q, case.d), case.seed, case.n_k)


def forward_cases() -> list[Case]:
    """The recorded forward cases: N from 16 to 4096 (ragged too), d 64/128, both dtypes, causal or not,
    the three variants, every kind."""
    out = []
    seed = 1000
    lengths = [
        (16, 16),
        (40, 40),
        (64, 64),
        (100, 100),
        (128, 128),
        (200, 200),
        (256, 256),
        (333, 333),
        (512, 512),
        (77, 130),
        (130, 77),
        (1000, 1000),
        (2048, 2048),
        (4096, 4096),
    ]
    for i, (nq, nk) in enumerate(lengths):
        for rep in range(2 if nq * nk <= 512 * 512 else 1):
            for d in (64, 128):
                for causal in (False, True):
                    for j, sm in enumerate(SOFTMAXES):
                        kind = KINDS[(i + j + int(causal) + 2 * rep) % len(KINDS)]
                        dtype = "bf16" if (i + j + d // 64 + rep) % 3 else "fp16"
                        if nq * nk > 1024 * 1024 and (d == 128 or j != 1):
                            continue  # keep the largest sizes few: the emulator takes seconds per case there
                        seed += 1
                        out.append(Case(nq, nk, d, dtype, causal, sm, kind, seed))
    return out


def fp8_cases() -> list[Case]:
    """FP8 E4M3 forward cases (inputs rounded to e4m3; 'tiny' inputs would be mostly zeros there).  333 x 150:
    with causal masking at d=128 rows 192-255 take the last key block by the diagonal's arithmetic in
    128-row programs and by the plain one in 64-row programs, so the recording pins FP8's query tiles."""
    out = []
    seed = 8000
    for i, (nq, nk) in enumerate([(64, 64), (77, 130), (200, 200), (333, 333), (1024, 1024), (333, 150)]):
        for d in (64, 128):
            for causal in (False, True):
                for j, sm in enumerate(SOFTMAXES):
                    seed += 1
                    out.append(Case(nq, nk, d, "e4m3", causal, sm, KINDS[(i + j + int(causal)) % 4], seed))
    return out


def cast_sum_cases() -> list[Case]:
    """Forward cases of the `cast_sum` softmax: FP8 E4M3 (its default) at every size, each input also with the
    standard softmax (the same seed), so the recording shows where they differ; bf16 or fp16 beside it; ragged
    lengths, d 64/128, causal or not; sharp rows ('large', where an E4M3 P underflows), 'random', and ties
    ('repeated', 'sink')."""
    out = []
    seed = 9000
    kinds = ("large", "random", "repeated", "sink")
    for i, (nq, nk) in enumerate([(64, 64), (77, 130), (200, 200), (333, 150), (333, 333)]):
        for d in (64, 128):
            for causal in (False, True):
                for dtype in ("e4m3", ("bf16", "fp16")[(i + d // 64 + int(causal)) % 2]):
                    seed += 1
                    kind = kinds[(i + int(causal) + d // 64) % len(kinds)] if dtype != "e4m3" or i % 2 else "large"
                    variants = ("cast_sum", "standard") if dtype == "e4m3" else ("cast_sum",)
                    out += [Case(nq, nk, d, dtype, causal, sm, kind, seed) for sm in variants]
    return out


def promote_pv_cases() -> list[Case]:
    """FP8 forward cases with P V promoted to FP32 every 32 keys (the FP8 default), cast_sum and the standard
    softmax on the same inputs, at the sizes of `cast_sum_cases` and two with many key blocks (1024 and
    2000 keys, where the 13-bit accumulation loses most); every kind but 'tiny' (mostly zeros in E4M3)."""
    out = []
    seed = 9700
    sizes = [(64, 64), (77, 130), (200, 200), (333, 333), (333, 150), (128, 1024), (100, 2000)]
    for i, (nq, nk) in enumerate(sizes):
        for d in (64, 128):
            for causal in (False, True):
                seed += 1
                kind = KINDS[(i + d // 64 + int(causal)) % 4]
                out += [Case(nq, nk, d, "e4m3", causal, sm, kind, seed, True) for sm in ("cast_sum", "standard")]
    return out


def cast_sum_backward_cases() -> list[Case]:
    """Forward with `cast_sum` then the backward (bf16, fp16): the backward sees the variant only through the
    forward's O and LSE = m + log2 l, with l summed from the cast P."""
    out = []
    seed = 9500
    for i, (nq, nk) in enumerate([(100, 100), (77, 130), (200, 200)]):
        for d in (64, 128):
            seed += 1
            dtype = ("bf16", "fp16")[(i + d // 64) % 2]
            out.append(Case(nq, nk, d, dtype, bool((i + d // 64) % 2), "cast_sum", ("large", "random")[i % 2], seed))
    return out


def backward_cases() -> list[Case]:
    """The recorded backward cases (the variant changes only the forward's O and LSE that feed it)."""
    out = []
    seed = 5000
    lengths = [
        (16, 16),
        (64, 64),
        (100, 100),
        (128, 128),
        (200, 200),
        (77, 130),
        (130, 77),
        (256, 256),
        (333, 333),
        (512, 512),
    ]
    for i, (nq, nk) in enumerate(lengths):
        for d in (64, 128):
            for causal in (False, True):
                for sm in ("standard", "robust") if i % 2 else ("stabilised",):
                    seed += 1
                    dtype = "bf16" if (i + d // 64 + int(causal)) % 3 else "fp16"
                    out.append(Case(nq, nk, d, dtype, causal, sm, KINDS[(i + int(causal)) % len(KINDS)], seed))
    return out


# ---- the NaN-row backward case (studies/device/record_nan_backward.py records it) ---------------------------
NAN_N, NAN_D, NAN_SEED = 128, 64, 2828
NAN_ROWS = (3, 77, 120)  # in both of the backward's 64-row query blocks
Q_ROW_VALUE = 1024.0  # scores of those rows: 1024 * sm_scale * log2 e = 184.7 exp2 units; the fix subtracts 369


def nan_rows_inputs(
    dtype: str = "bf16", n: int = NAN_N, d: int = NAN_D, seed: int = NAN_SEED, rows: tuple[int, ...] = NAN_ROWS
) -> dict[str, np.ndarray]:
    """q, k, v, do of one head, shapes (n, d), as float32 arrays of `dtype` values (rounded RNE): the rows
    `rows` of q are `Q_ROW_VALUE` e_0 and column 0 of k is 1, every other value an N(0, 1) draw."""
    rng = np.random.default_rng(seed)
    x = {name: rng.standard_normal((n, d)) for name in ("q", "k", "v", "do")}
    x["k"][:, 0] = 1.0
    x["q"][list(rows)] = 0.0
    x["q"][list(rows), 0] = Q_ROW_VALUE
    fmt = kernel_format(dtype)
    return {name: ef.quantize(a, fmt).astype(np.float32) for name, a in x.items()}


__all__ = [
    "NAN_ROWS",
    "nan_rows_inputs",
    "Case",
    "KINDS",
    "SOFTMAXES",
    "backward_cases",
    "batch",
    "cast_sum_backward_cases",
    "cast_sum_cases",
    "forward_cases",
    "fp8_cases",
    "inputs",
    "promote_pv_cases",
]
