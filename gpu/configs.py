"""Launch configurations of the attention kernels, and the flashsim policy that repeats one (no torch needed)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from flashsim import Policy, triton_policy
from flashsim.policy import kernel_format
from flashsim.softmax import RobustSoftmax, SoftmaxVariant, get_softmax


@dataclass(frozen=True)
class Config:
    """Tiles and launch parameters of one kernel (the emulator needs the tiles to repeat it)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

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


#: (head_dim, causal) -> forward config; the fastest of 8 tried on the H100 at N=4096 (gpu/run_attention.py
#: --sections configs; docs/performance.md).  The tiles and warps are part of what the kernel computes.
FWD_CONFIGS = {(64, False): Config(128, 64, 4, 3), (64, True): Config(64, 64, 4, 3),
               (128, False): Config(128, 128, 8, 3), (128, True): Config(128, 128, 8, 3),
               # d=256: the fastest of 6 on the H100 (results.json fwd_configs_d256; ptxas spills 0-20 bytes a
               # thread; wider or taller tiles spill hundreds, a third stage does not fit in shared memory)
               (256, False): Config(128, 64, 8, 2), (256, True): Config(128, 64, 8, 2)}
#: (head_dim, causal) -> forward config for FP8 E4M3 where it differs from FWD_CONFIGS: one warpgroup of 64
#: query rows a program, 1.02-1.17x faster than 128 rows on 8 warps at d=128 and 1.03-1.08x (4 warps) at d=64
#: without causal masking, with or without the fixes (the products on e4m3 tensor cores take half the time
#: of bf16's, so the softmax weighs more; H100, paired rounds: docs/performance.md, "FP8 E4M3 forward").  The
#: query tiles decide which blocks take the causal diagonal's arithmetic, so they are part of what the kernel
#: computes, as for bf16 (without causal masking they change no bit).
#: At d=256, 64 x 64 tiles of 4 warps, 3 stages: 1.21-1.35x the bf16 tiles (128 x 64, 8 warps, 2 stages)
#: in both maskings (H100, results.json ``fp8_d256``).
FP8_FWD_CONFIGS = {(64, False): Config(64, 64, 4, 3), (128, False): Config(64, 128, 4, 3),
                   (128, True): Config(64, 128, 4, 3), (256, False): Config(64, 64, 4, 3),
                   (256, True): Config(64, 64, 4, 3)}
#: (head_dim, causal) -> the number of keys from which the forward kernel "auto" picks the overlap kernel
#: (where it can run); other head dims always take the tl kernel.  Measured on the H100 (median of 3
#: interleaved rounds, N = 512 to 4096; results.json ``kernel_choice``, docs/performance.md): at d=128 the
#: overlap kernel is faster from N=1024 on without causal masking and from N=2048 with it; at d=64 it is
#: slower everywhere.  Both kernels give the same bits, so the choice changes only the time.
OVERLAP_FROM_KEYS = {(128, False): 1024, (128, True): 2048}
#: the same for FP8 E4M3: empty, as with FP8 the overlap kernel was level with the tl kernel at d=128 (0.92-1.03x
#: on FP8's tiles) and slower at d=64 (results.json ``fp8_overlap``)
FP8_OVERLAP_FROM_KEYS: dict[tuple[int, bool], int] = {}
#: head_dim -> backward config (dK/dV and dQ kernels share the tiles)
#: d=256: 64 x 64 tiles with 8 warps, although ptxas spills 96 bytes a thread in the dK/dV kernel there:
#: 206-211 TFLOP/s on the H100 at N=4096 against 149-151 for the spill-free 32 x 64 (and 86-179 for 3 other
#: configurations; results.json ``bwd_configs_d256``), and both kernels on wgmma.
BWD_CONFIGS = {64: Config(64, 64, 4, 3), 128: Config(64, 64, 4, 2), 256: Config(64, 64, 8, 2)}
DELTA_BLOCK = 64


def fwd_config(dtype: str, head_dim: int, causal: bool) -> Config:
    """The forward kernel's default tiles for inputs of ``dtype`` ('bf16', 'fp16' or 'e4m3')."""
    key = (head_dim, bool(causal))
    return FP8_FWD_CONFIGS.get(key, FWD_CONFIGS[key]) if dtype == "e4m3" else FWD_CONFIGS[key]


def overlap_from_keys(dtype: str, head_dim: int, causal: bool) -> float:
    """The number of keys from which ``kernel='auto'`` runs the overlap kernel for inputs of ``dtype`` (inf:
    never)."""
    table = FP8_OVERLAP_FROM_KEYS if dtype == "e4m3" else OVERLAP_FROM_KEYS
    return table.get((head_dim, bool(causal)), float("inf"))


def kernel_policy_args(dtype: str, head_dim: int, causal: bool, fwd: Config | None = None,
                       bwd: Config | None = None) -> dict:
    """Keyword arguments of :func:`flashsim.triton_policy` for our kernels launched with these configs
    (defaults: the tables above)."""
    f = fwd or fwd_config(dtype, head_dim, causal)
    b = bwd or BWD_CONFIGS[head_dim]
    return dict(dtype=dtype, block_m=f.block_m, block_n=f.block_n, num_warps=f.num_warps, bwd_block_m=b.block_m,
                bwd_block_n=b.block_n)


def kernel_policy(dtype: str, head_dim: int, causal: bool, fwd: Config | None = None,
                  bwd: Config | None = None) -> Policy:
    """flashsim's policy for our kernels launched with these configs (defaults: the tables above)."""
    return triton_policy(**kernel_policy_args(dtype, head_dim, causal, fwd, bwd))


def kernel_variant(softmax: str | SoftmaxVariant, dtype: str) -> SoftmaxVariant:
    """flashsim's variant object for the kernel's ``softmax`` ('robust' gets P's precision from ``dtype``)."""
    if isinstance(softmax, str):
        return _named_variant(softmax, dtype)
    return get_softmax(softmax)


@functools.lru_cache(maxsize=64)
def _named_variant(softmax: str, dtype: str) -> SoftmaxVariant:
    """kernel_variant for a name, cached (variants are frozen): it runs on every kernel launch."""
    if softmax == "robust":
        return RobustSoftmax(p_precision=kernel_format(dtype).precision)  # P's significand bits
    return get_softmax(softmax)
