"""The inputs of the probe recordings (tests/data/h100, tests/data/libdevice), regenerated from their seeds.

Each function draws what a device script drew, in the same order from the same `numpy.random.default_rng`
seed, and returns the input arrays under the names the device file gave them (bits as unsigned integers).
The recordings keep only the SHA-256 of those arrays (`flashsim.recording`), so a test checks the
regenerated inputs against their digests before it checks any output; `tools/keep_recording.py` checks
them against a fresh device file before it drops the inputs.  numpy and emufloat only: the device scripts
import torch, these functions do not.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

#: the seeds the device scripts used (their defaults; each recording's JSON names its own)
PROBE_SEED = 20251122  # studies/device/run_probes.sh (python -m studies.probes.run): mma.npz, reduction.npz
VERIFY_SEED = 20261122  # studies/device/run_verify.sh (studies/device/verify_models.py): functions.npz, tf32.npz
LG2_SEED = 20261127  # python -m studies.probes.lg2: lg2_sample.npz
MMA_SYNC_SEED = 20261127  # python -m studies.probes.mma_sync: mma_sync.npz
CUDA_MATH_SEED = 20261128  # python -m studies.probes.cuda_math: cuda_math.npz
LOG2_FMA_SEED = 7  # studies/device/run_attention.py --sections log2: attention/log2.npz


def _u32(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def _f32(bits: int) -> float:
    return float(np.uint32(bits).view(np.float32))


def edge_bits() -> np.ndarray:
    """Bit patterns of special and boundary float32 values, both signs (`verify_models.edge_bits`)."""
    vals = []
    for e in range(256):
        for f in (0, 1, 2, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF):
            vals.append((e << 23) | f)
    for x in (1.0, 126.0, 126.5, 127.0, 127.99999, 128.0, 149.0, 150.0, 252.0, 256.0, 0.5, 88.72, 87.33, 103.97):
        b = _u32(x)
        vals += [b - 1, b, b + 1]
    v = np.array(vals, dtype=np.uint64) & 0x7FFFFFFF
    return np.unique(np.concatenate([v, v | 0x80000000]).astype(np.uint32))


def special_pairs() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The division probe's special and boundary (a, b) pairs as float32 arrays, with a tag each: every pair of
    special values ('cross'), divisors next to each power of two ('b_near_pow2'), quotients around the overflow
    and underflow thresholds ('q_near_overflow', 'q_near_underflow')."""
    vals = [
        0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 2.0, 3.0, 0.5, 1.5, 10.0, 0.1, 7.0, 1 / 3,
        _f32(0x00000001), _f32(0x80000001), _f32(0x007FFFFF), _f32(0x00400000),
        _f32(0x00800000), _f32(0x00800001), _f32(0x7F7FFFFF), _f32(0xFF7FFFFF),
        _f32(0x7F000000), _f32(0x7E800000), _f32(0x7E800001), _f32(0x7E7FFFFF),
        _f32(0x3F7FFFFF), _f32(0x3F800001), _f32(0x3FFFFFFF), _f32(0x01000000),
        _f32(0x34000000), _f32(0x4B000000), 2.0**64, 2.0**-64, 2.0**100, 2.0**-100,
    ]  # fmt: skip
    a = [x for x in vals for _ in vals]
    b = [y for _ in vals for y in vals]
    tags = ["cross"] * len(a)
    nums = [1.0, 1.5, 3.0, _f32(0x3FFFFFFF), _f32(0x7F7FFFFF), _f32(0x00800000), _f32(0x3F800001)]
    for k in range(-149, 128):
        bb = _u32(2.0**k)
        for bbits in (bb - 1, bb, bb + 1):
            if bbits <= 0 or bbits >= 0x7F800000:
                continue
            for x in nums:
                a += [x, -x]
                b += [_f32(bbits), _f32(bbits)]
                tags += ["b_near_pow2"] * 2
    for e in range(-6, 7):
        a += [_f32(0x7F7FFFFF), 2.0**-120]
        b += [2.0**e, 2.0 ** (6 + e)]
        tags += ["q_near_overflow", "q_near_underflow"]
    with np.errstate(all="ignore"):
        return np.array(a, dtype=np.float32), np.array(b, dtype=np.float32), tags


def functions_inputs(seed: int = VERIFY_SEED, n: int = 1 << 17) -> dict[str, np.ndarray]:
    """functions.npz (`verify_models --sections cases`): `x` (n random bit patterns, then
    `edge_bits()`) and the division's `div_a`, `div_b` (n random pairs, then `special_pairs()`)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), edge_bits()])
    sa, sb, _ = special_pairs()
    a = np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), sa.view(np.uint32)])
    b = np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), sb.view(np.uint32)])
    return {"x": x, "div_a": a, "div_b": b}


def libdevice_inputs(seed: int = VERIFY_SEED, n: int = 1 << 17) -> dict[str, np.ndarray]:
    """libdevice/log2f.npz (`verify_models --sections libdevice`): `x`, n random bit patterns then
    `edge_bits()`."""
    rng = np.random.default_rng(seed)
    return {"x": np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), edge_bits()])}


def lg2_sample_inputs(seed: int = LG2_SEED) -> dict[str, np.ndarray]:
    """lg2_sample.npz (`python -m studies.probes.lg2`): 2**17 random bit patterns, 2**15 values in [1/4, 4),
    2**13 around 1."""
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            rng.integers(0, 2**32, 2**17, dtype=np.uint64).astype(np.uint32),
            (rng.uniform(0.25, 4.0, 2**15).astype(np.float32)).view(np.uint32),
            np.float32(1.0).view(np.uint32) + rng.integers(-(2**12), 2**12, 2**13).astype(np.uint32),
        ]
    )
    return {"x": x}


def cuda_math_inputs(seed: int = CUDA_MATH_SEED, keep: int = 1 << 14) -> dict[str, np.ndarray]:
    """cuda_math.npz: the first `keep` inputs of each of the five drawn parts of `python -m
    studies.probes.cuda_math` (random bit patterns; exp arguments in [-100, 90] and [-30, 0]; log arguments over
    2**-20..2**20; just above 1), then its 16 special values; the probe ran all 950,288."""
    rng = np.random.default_rng(seed)
    parts = [
        rng.integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32),
        rng.uniform(-100.0, 90.0, 2**18).astype(np.float32).view(np.uint32),
        rng.uniform(-30.0, 0.0, 2**17).astype(np.float32).view(np.uint32),
        np.exp2(rng.uniform(-20.0, 20.0, 2**18)).astype(np.float32).view(np.uint32),
        np.float32(1.0).view(np.uint32) + rng.integers(0, 2**16, 2**15).astype(np.uint32),
    ]
    special = np.array(
        [0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000]
        + [0x42B17218, 0x42B17217, 0xC2AEAC50, 0xC2CFF1B5, 0xC2D00000, 0x7F7FFFFF],
        np.uint32,
    )
    return {"x": np.concatenate([p[:keep] for p in parts] + [special])}


def log2_fma_inputs(seed: int = LOG2_FMA_SEED) -> np.ndarray:
    """Every input of `run_attention.sh --sections log2` (405,509 float32 bit patterns: positive finite,
    [1/2, 2), around 1, zero and subnormals, specials); the recording keeps a sample of them by position."""
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [
            rng.integers(0, 0x7F800000, 1 << 18, dtype=np.uint32),
            rng.integers(0x3F000000, 0x40000000, 1 << 17, dtype=np.uint32),
            np.arange(0x3F7FF000, 0x3F801000, dtype=np.uint32),
            np.arange(0, 4096, dtype=np.uint32),
            np.array([0x7F800000, 0x7FC00000, 0x80000000, 0xBF800000, 0x7F7FFFFF], np.uint32),
        ]
    )


def bf16_grid() -> np.ndarray:
    """Every bf16 value as float32 bits, in bit order (torch_exp_log.npz's inputs)."""
    return np.arange(2**16, dtype=np.uint32) << 16


# ---- tensor cores --------------------------------------------------------------------------------------
STRESS_K = {"bf16": (16, 32, 64, 128, 256), "fp16": (16, 32, 64, 128, 256), "e4m3": (32, 64, 128, 256),
            "e5m2": (32, 64, 128, 256)}  # fmt: skip


def stress_tiles(
    seed: int = PROBE_SEED, n_target: int = 200_000, formats: tuple[str, ...] | None = None
) -> dict[str, np.ndarray]:
    """mma.npz's inputs (`python -m studies.probes.run`, probe mma): per input type (of `formats`; default all), a
    generator seeded with `seed + 1000 * (1 + its index)` draws the tiles of each (K, with C or not) in order
    (`studies.probes.mma_cases.gen_stress_tiles`); keys '<type>_K<K>_<c|noc>_<a|bt|scen_a|scen_b|c>'."""
    from studies.probes import mma_cases
    from studies.probes.formats import FORMATS

    out: dict[str, np.ndarray] = {}
    for index, (name, fmt) in enumerate(FORMATS.items()):
        if formats is not None and name not in formats:
            continue
        configs = [(k, hc) for k in STRESS_K[name] for hc in (False, True)]
        n_tiles = max(1, -(-n_target // (4096 * len(configs))))
        rng = np.random.default_rng(seed + 1000 * (1 + index))
        for k, hc in configs:
            tiles = mma_cases.gen_stress_tiles(rng, fmt, k, n_tiles, hc)
            out.update({f"{name}_K{k}_{'c' if hc else 'noc'}_{part}": a for part, a in tiles.items()})
    return out


def tf32_tiles(seed: int = VERIFY_SEED) -> dict[str, np.ndarray]:
    """tf32.npz's inputs (`verify_models --sections tf32`, generator seeded with `seed + 2`): 12 tiles per
    K in 16, 64, 128, without and with C; keys 'K<K>_<c|noc>_<a|bt|c>' (float32 bits)."""
    rng = np.random.default_rng(seed + 2)
    out: dict[str, np.ndarray] = {}
    nt = 12
    for k in (16, 64, 128):
        for hc in (False, True):
            mag = 2.0 ** rng.integers(-20, 21, size=(2, nt, 64, k))
            vals = rng.standard_normal((2, nt, 64, k)) * mag
            vals[rng.random((2, nt, 64, k)) < 0.1] = 0.0
            vals[0, :, :, : k // 2] *= np.where(rng.random((nt, 64, 1)) < 0.3, 2.0**30, 1.0)
            c32 = (rng.standard_normal((nt, 64, 64)) * 2.0 ** rng.integers(-10, 11, size=(nt, 64, 64))).astype(
                np.float32
            )
            tag = f"K{k}_{'c' if hc else 'noc'}"
            out[f"{tag}_a"] = vals[0].astype(np.float32).view(np.uint32)
            out[f"{tag}_bt"] = vals[1].astype(np.float32).view(np.uint32)
            if hc:
                out[f"{tag}_c"] = c32.view(np.uint32)
    return out


def mma_sync_inputs(
    seed: int = MMA_SYNC_SEED, tiles: int = 1024, chains: int = 256, keep: tuple[int, int] = (256, 64)
) -> dict[str, np.ndarray]:
    """mma_sync.npz's inputs (`python -m studies.probes.mma_sync`): per dtype and shape, A (tiles, 16, k) and B^T
    (tiles, 8, k) as dtype bits, C (tiles, 16, 8) as float32 bits (zero for the chains k64, k8x4), drawn in the
    probe's order for `tiles` one-step tiles and `chains` chains; the first `keep` of each (the
    recording's subset); keys '<dtype>_<k16|k64|k8|k8x4>_<a|bt|c>'."""
    shapes = {"k16": (tiles, 16, False), "k64": (chains, 64, True), "k8": (tiles, 8, False), "k8x4": (chains, 32, True)}
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for names in (("k16", "k64"), ("k8", "k8x4")):
        for dtype in ("bf16", "fp16"):
            np_dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
            for name in names:
                n, k, zero_c = shapes[name]
                fam = np.arange(n) % 4
                a = rng.standard_normal((n, 16, k))
                b = rng.standard_normal((n, 8, k))
                c = rng.standard_normal((n, 16, 8))
                wide = fam == 1
                span = 12 if dtype == "bf16" else 6
                a[wide] *= 2.0 ** rng.integers(-span, span + 1, a[wide].shape)
                b[wide] *= 2.0 ** rng.integers(-span, span + 1, b[wide].shape)
                c[wide] *= 2.0 ** rng.integers(-span, span + 1, c[wide].shape)
                c[fam == 2] *= 64.0
                a[fam == 3] *= 8.0
                b[fam == 3] *= 8.0
                c[fam == 3] = 0.0
                if zero_c:
                    c[:] = 0.0
                m = keep[0] if n == tiles else keep[1]
                # bf16 through float32: the recording's ml_dtypes rounded float64 to bf16 that way (twice; later
                # versions round once, which differs in one of the recorded values); numpy rounds to fp16 once
                via = np.float32 if dtype == "bf16" else np.float64
                out[f"{dtype}_{name}_a"] = a[:m].astype(via).astype(np_dt).view(np.uint16)
                out[f"{dtype}_{name}_bt"] = b[:m].astype(via).astype(np_dt).view(np.uint16)
                out[f"{dtype}_{name}_c"] = c[:m].astype(np.float32).view(np.uint32)
    return out


# ---- reductions ----------------------------------------------------------------------------------------
ROW_KINDS = ("normal", "exp_like", "wide", "cancel", "bits")


def random_rows(rng: np.random.Generator, n: int, bn: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of bn float32 values, each of one of `ROW_KINDS` (the reduction probe's random rows), and the kinds."""
    kind = rng.integers(0, len(ROW_KINDS), size=n)
    out = np.zeros((n, bn), dtype=np.float32)
    for i in range(n):
        k = ROW_KINDS[kind[i]]
        if k == "normal":
            v = rng.standard_normal(bn) * 2.0 ** rng.integers(-10, 10)
        elif k == "exp_like":
            v = np.exp2(-rng.exponential(4.0, bn))
            v[rng.integers(0, bn, size=rng.integers(1, 4))] = 1.0
        elif k == "wide":
            v = rng.choice([-1.0, 1.0], bn) * 2.0 ** rng.uniform(-30, 30, bn)
        elif k == "cancel":
            h = rng.standard_normal(bn // 2) * 2.0 ** rng.integers(-5, 20)
            v = np.concatenate([h, -h])
            v = v[rng.permutation(bn)] + rng.standard_normal(bn) * 2.0**-10
        else:
            b = rng.integers(0, 2**32, size=bn, dtype=np.uint64).astype(np.uint32)
            e = (b >> 23) & 0xFF
            b = np.where((e > 127 + 60) | (e < 127 - 60), (b & 0x807FFFFF) | (127 << 23), b)
            v = b.view(np.float32)
        out[i] = np.asarray(v, dtype=np.float32)
    return out, kind.astype(np.int8)


def reduction_rows(
    seed: int = PROBE_SEED, n: int = 10240, block_ns: tuple[int, ...] = (64, 128)
) -> dict[str, np.ndarray]:
    """reduction.npz's rows (`python -m studies.probes.run`, probe reduction: a generator seeded with
    `seed + 7`, rows per BLOCK_N in increasing order): 'rows_BN<n>' (float32 bits) and 'rows_BN<n>_kind'."""
    rng = np.random.default_rng(seed + 7)
    out: dict[str, np.ndarray] = {}
    for bn in sorted(block_ns):
        rows, kinds = random_rows(rng, n, bn)
        out[f"rows_BN{bn}"] = rows.view(np.uint32)
        out[f"rows_BN{bn}_kind"] = kinds
    return out


__all__ = [
    "CUDA_MATH_SEED",
    "LG2_SEED",
    "LOG2_FMA_SEED",
    "MMA_SYNC_SEED",
    "PROBE_SEED",
    "ROW_KINDS",
    "STRESS_K",
    "VERIFY_SEED",
    "bf16_grid",
    "cuda_math_inputs",
    "edge_bits",
    "functions_inputs",
    "lg2_sample_inputs",
    "libdevice_inputs",
    "log2_fma_inputs",
    "mma_sync_inputs",
    "reduction_rows",
    "special_pairs",
    "stress_tiles",
    "tf32_tiles",
]


#: studies/device/launch_replay.py's torch.sum rows: lengths off the 16-byte vector (two on it), rows a launch
SUM_SEED = 2_026_620_300
SUM_LENGTHS = (128, 129, 130, 131, 133, 150, 161, 199, 200, 255, 257, 300, 333, 386, 450, 509, 511)
SUM_ROWS = (1, 16, 150, 512)


def sum_rows_inputs(seed: int = SUM_SEED) -> dict[str, np.ndarray]:
    """The (rows, n) float32 tensors `torch.sum(dim=-1)` was launched on, by key ``s{itemsize}_n{n}_r{rows}``:
    positive fp32 rows (itemsize 4), and bf16 values summed under autocast (itemsize 2), magnitudes spread
    over 2**-8..2**8 a row so that the order of the additions shows."""
    from emufloat import BF16, quantize

    rng, out = np.random.default_rng(seed), {}
    for itemsize in (4, 2):
        for n in SUM_LENGTHS:
            for rows in SUM_ROWS:
                x = (rng.standard_normal((rows, n)) * np.exp2(rng.integers(-8, 8, (rows, 1)))).astype(np.float32)
                x = np.abs(x) if itemsize == 4 else np.asarray(quantize(x, BF16), np.float32)
                out[f"s{itemsize}_n{n}_r{rows}"] = x
    return out
