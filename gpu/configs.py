"""Launch configurations of the attention kernels: the formats of each dtype, tiles, warps and stages, which
forward kernel runs, and the softmax and P V promotion a launch gets when not told (no torch needed).  These
are part of what a kernel computes: `gpu.policies` turns a launch's configs into the flashsim policy that
repeats it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import emufloat as ef
from emufloat import BF16, E4M3FN, FP16
from flashsim.softmax import RobustSoftmax, SoftmaxVariant, get_softmax

#: input dtype name -> the format of q, k, v and P
KERNEL_FORMATS = {"bf16": BF16, "fp16": FP16, "e4m3": E4M3FN}


def kernel_format(dtype: str) -> ef.Format:
    """The format of the kernels' inputs and P for a dtype name ('bf16', 'fp16', 'e4m3')."""
    if dtype not in KERNEL_FORMATS:
        raise ValueError(f"dtype: expected one of {sorted(KERNEL_FORMATS)}, got {dtype!r}")
    return KERNEL_FORMATS[dtype]


def kernel_output_format(dtype: str) -> ef.Format:
    """The format the kernels write O (and gradients) in: BF16 for the FP8 forward, else the input format."""
    return BF16 if dtype == "e4m3" else kernel_format(dtype)


#: how the FP8 forward's cast_sum reads P's E4M3 values for l: float32 arithmetic beside the cast, or packed conversions
E4M3_SUMS = ("arith", "packed")


@dataclass(frozen=True)
class Config:
    """Tiles and launch parameters of one kernel (the emulator needs the tiles to repeat it).  ``e4m3_sum``: how
    the FP8 tl forward's cast_sum reads the E4M3 values of P that l sums (`E4M3_SUMS`; the same values either way,
    a question of speed: `gpu.kernels.steps.e4m3_values`, `e4m3_widened`)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    e4m3_sum: str = "arith"

    def __post_init__(self) -> None:
        """Refuse tiles the kernels cannot run (tl.arange needs powers of two, tl.dot at least 16), rather than
        fail later inside Triton with a division by zero or a compiler error."""
        for name, lo, hi in (("block_m", 16, 256), ("block_n", 16, 256), ("num_warps", 1, 16)):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi or x & (x - 1):
                raise ValueError(f"Config.{name}: expected a power of two from {lo} to {hi}, got {x!r}")
        x = self.num_stages
        if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 8:
            raise ValueError(f"Config.num_stages: expected an integer from 1 to 8, got {x!r}")
        if self.e4m3_sum not in E4M3_SUMS:
            raise ValueError(f"Config.e4m3_sum: expected one of {E4M3_SUMS}, got {self.e4m3_sum!r}")


#: (head_dim, causal) -> forward config: at d=64 and 128 the fastest of eight tiles measured on the H100 at
#: N=4096 (studies/device/run_attention.py --sections configs; history/tried.md, "Tiles, kernel choice and host
#: time").  The tiles and warps are part of what the kernel computes.
FWD_CONFIGS = {
    (64, False): Config(128, 64, 4, 3),
    (64, True): Config(64, 64, 4, 3),
    (128, False): Config(128, 128, 8, 3),
    (128, True): Config(128, 128, 8, 3),
    # d=256: the fastest of six measured (history/tried.md); ptxas spills 0-20 bytes a thread with
    # these tiles, wider or taller ones spill hundreds, and a third stage does not fit in shared memory
    (256, False): Config(128, 64, 8, 2),
    (256, True): Config(128, 64, 8, 2),
}
#: (head_dim, causal) -> forward config for FP8 E4M3 where it differs from FWD_CONFIGS: one warpgroup of 64
#: query rows a program, faster than the bf16 tiles' 128 rows (8 warps at d=128; 4 warps at d=64, where
#: FP8 takes its own tiles only without causal masking), with or without the fixes (the products on e4m3
#: tensor cores take half the time of bf16's, so the softmax weighs more); at d=256, 64 x 64 tiles of 4
#: warps, 3 stages, faster than the bf16 tiles (128 x 64, 8 warps, 2 stages) in both maskings.  Measured
#: on the H100 by paired rounds: history/tried.md, "FP8 E4M3 forward".  The query tiles decide which blocks
#: take the causal diagonal's arithmetic, so they are part of what the kernel computes, as for bf16
#: (without causal masking they change no bit).
FP8_FWD_CONFIGS = {
    (64, False): Config(64, 64, 4, 3),
    (128, False): Config(64, 128, 4, 3),
    (128, True): Config(64, 128, 4, 3),
    (256, False): Config(64, 64, 4, 3),
    (256, True): Config(64, 64, 4, 3),
}
#: (head_dim, causal) -> the number of keys from which the forward kernel "auto" picks the overlap kernel
#: (where it can run); other head dims always take the tl kernel.  Measured on the H100 (interleaved rounds,
#: N = 512 to 4096; docs/performance.md, "Which forward kernel", and history/tried.md): at d=128 the overlap
#: kernel is faster from N=1024 on without causal masking and from N=2048 with it; at d=64 it is slower
#: everywhere.  Both kernels give the same bits, so the choice changes only the time.
OVERLAP_FROM_KEYS = {(128, False): 1024, (128, True): 2048}
#: the same for FP8 E4M3: empty, as with FP8 the overlap kernel is only level with the tl kernel at d=128
#: (on FP8's tiles) and slower at d=64 (docs/performance.md, "FP8 E4M3 forward")
FP8_OVERLAP_FROM_KEYS: dict[tuple[int, bool], int] = {}
#: head_dim -> backward config (dK/dV and dQ kernels share the tiles): at d=64 and 128 the fastest of six
#: measured in the same run as the forward's (history/tried.md).  d=256: 64 x 64 tiles with 8 warps, although ptxas
#: spills 96 bytes a thread in the dK/dV kernel there: both kernels then run on wgmma, and these tiles beat
#: the spill-free 32 x 64 and three other configurations (history/tried.md, "Backward").
BWD_CONFIGS = {64: Config(64, 64, 4, 3), 128: Config(64, 64, 4, 2), 256: Config(64, 64, 8, 2)}
DELTA_BLOCK = 64


def fwd_config(dtype: str, head_dim: int, causal: bool) -> Config:
    """The forward kernel's default tiles for inputs of `dtype` ('bf16', 'fp16' or 'e4m3'); a ValueError naming
    `head_dim` for a head dim the tables have no tiles for."""
    key = (head_dim, bool(causal))
    if key not in FWD_CONFIGS:
        heads = sorted({h for h, _ in FWD_CONFIGS})
        raise ValueError(f"head_dim: the forward kernels' tiles are tabled for head dims {heads}, got {head_dim!r}")
    return FP8_FWD_CONFIGS.get(key, FWD_CONFIGS[key]) if dtype == "e4m3" else FWD_CONFIGS[key]


def overlap_from_keys(dtype: str, head_dim: int, causal: bool) -> float:
    """The number of keys from which `kernel='auto'` runs the overlap kernel for inputs of `dtype` (inf:
    never)."""
    table = FP8_OVERLAP_FROM_KEYS if dtype == "e4m3" else OVERLAP_FROM_KEYS
    return table.get((head_dim, bool(causal)), float("inf"))


#: the forward kernels' softmax when none is named, per dtype (docs/fix.md, "The table from hunts"): `cast_sum`
#: (l summed from P as cast for P V) for every dtype: a hunt of the family space pushes the standard softmax
#: beyond the margin under the bf16 and fp16 kernels' policies, and finds no family where cast_sum leans
DEFAULT_SOFTMAX = {"bf16": "cast_sum", "fp16": "cast_sum", "e4m3": "cast_sum"}


def default_softmax(dtype: str) -> str:
    """The kernels' softmax for `dtype` when none is named (`DEFAULT_SOFTMAX`)."""
    kernel_format(dtype)  # refuses an unknown dtype, naming the accepted ones
    return DEFAULT_SOFTMAX[dtype]


#: whether the forward kernels promote P V's partial sums to FP32 every 32 keys when not told, per dtype
#: (docs/fix.md): for FP8, whose tensor cores otherwise accumulate in 13 truncated bits, which leans O on
#: dense rows even with cast_sum; BF16 and FP16 tensor cores accumulate in FP32 and have no such option
DEFAULT_PROMOTE_PV = {"bf16": False, "fp16": False, "e4m3": True}


def default_promote_pv(dtype: str) -> bool:
    """Whether the kernels promote P V's partial sums for `dtype` when not told (`DEFAULT_PROMOTE_PV`)."""
    kernel_format(dtype)
    return DEFAULT_PROMOTE_PV[dtype]


def kernel_variant(softmax: str | SoftmaxVariant | None, dtype: str) -> SoftmaxVariant:
    """flashsim's variant object for the kernel's `softmax` ('robust' gets P's precision from `dtype`;
    None: [`default_softmax`][gpu.policies.default_softmax])."""
    if softmax is None:
        softmax = default_softmax(dtype)
    if isinstance(softmax, str):
        return _named_variant(softmax, dtype)
    return get_softmax(softmax)


@functools.lru_cache(maxsize=64)
def _named_variant(softmax: str, dtype: str) -> SoftmaxVariant:
    """kernel_variant for a name, cached (variants are frozen): it runs on every kernel launch."""
    if softmax == "robust":
        return RobustSoftmax(p_precision=kernel_format(dtype).precision)  # P's significand bits
    return get_softmax(softmax)


__all__ = [
    "BWD_CONFIGS",
    "DEFAULT_PROMOTE_PV",
    "DEFAULT_SOFTMAX",
    "E4M3_SUMS",
    "KERNEL_FORMATS",
    "default_promote_pv",
    "default_softmax",
    "kernel_format",
    "kernel_output_format",
    "kernel_variant",
    "Config",
    "DELTA_BLOCK",
    "FP8_FWD_CONFIGS",
    "FP8_OVERLAP_FROM_KEYS",
    "FWD_CONFIGS",
    "OVERLAP_FROM_KEYS",
    "fwd_config",
    "overlap_from_keys",
]
