"""The Triton attention kernels: compiled for the H100 on the CPU (no GPU needed), and run live on a GPU.

The compile tests need triton only; the live tests (marked `gpu`) need CUDA and skip without it.
"""

import contextlib
import io
import math
import re

import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from gpu.configs import BWD_CONFIGS, FWD_CONFIGS, Config, fwd_config  # noqa: E402
from gpu.kernels.bwd import attn_bwd_dkdv, attn_bwd_dq  # noqa: E402
from gpu.kernels.fwd import DebugOutputs, attn_fwd, transpose_keys  # noqa: E402
from gpu.kernels.steps import SoftmaxConstants  # noqa: E402
from gpu.policies import default_promote_pv  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(H100)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
CONSTS = SoftmaxConstants(*[0.5] * len(SoftmaxConstants._fields))  # float values do not enter the compiled code


def _compile(fn, args, constexprs, **options):
    """`fn` compiled for the H100 as `fn[grid](*args, **constexprs, **options)` compiles it on one: Triton
    3.6's own binder specialises the arguments (pointers 16-byte aligned and integers divisible by 16 marked
    so, integers equal to 1 made constants, records field by field), then `triton.compile` as
    `JITFunction.run` calls it.  The compiled kernel's `ptxas_log` holds ptxas -v's report when this call
    ran ptxas (Triton runs it with -v), "" when the kernel came from Triton's cache."""
    kwargs = {**constexprs, **options}
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    bound, specialization, opts = binder(*args, **kwargs)
    opts, signature, consts, attrs = fn._pack_args(BACKEND, kwargs, bound, specialization, opts)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        Source = ASTSource
    out = io.StringIO()
    with _knob(triton.knobs.nvidia, "dump_ptxas_log", True), contextlib.redirect_stdout(out):
        kernel = triton.compile(Source(fn, signature, consts, attrs), target=H100, options=opts.__dict__)
    kernel.ptxas_log = out.getvalue()
    return kernel


@contextlib.contextmanager
def _knob(group, name: str, value):
    """Triton knob `name` of `group` set to `value` for a block."""
    old = getattr(group, name)
    setattr(group, name, value)
    try:
        yield
    finally:
        setattr(group, name, old)


def _ptr(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A pointer argument (a 16-byte-aligned CPU tensor: compiling reads only its dtype and alignment)."""
    return torch.empty(16, dtype=dtype)


def _compile_forward(key, softmax, n=1000, dtype="bf16", v_t=False, promote=None, packed=False):
    """The tl forward kernel for tiles `key` = (d, causal) with N_Q = N_K = `n`, as gpu.flash launches it
    (`n = 1`: N_K and N_BLK made constants, N_Q not, as the kernel asks).  `dtype`: 'bf16' or 'fp8'
    (e4m3, O in bf16); `v_t`: V transposed, its rows a multiple of 16 keys (as gpu.flash passes FP8's V);
    `promote`: PROMOTE_PV (None: gpu.flash's default for the dtype); `packed`: E4M3_PACKED."""
    d, causal = key
    cfg = fwd_config("e4m3" if dtype == "fp8" else dtype, d, causal)
    x = _ptr(DTYPES[dtype])
    lse = _ptr()
    n_vt = -(-n // 16) * 16 if v_t else n
    args = (
        x,
        x,
        x,
        _ptr(torch.bfloat16),
        lse,
        DebugOutputs(lse, lse, lse, lse),
        CONSTS,
        n,
        n,
        -(-n // cfg.block_n),
        n_vt,
    )
    const = dict(
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=causal,
        SOFTMAX=softmax,
        DEBUG=False,
        STAGES=cfg.num_stages,
        V_T=v_t,
        PROMOTE_PV=_promote(dtype, promote),
        E4M3_PACKED=packed,
    )
    return _compile(attn_fwd, args, const, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _promote(dtype: str, promote: bool | None) -> bool:
    """PROMOTE_PV as gpu.flash passes it for this test's dtype name ('fp8' is 'e4m3' there)."""
    return default_promote_pv("e4m3" if dtype == "fp8" else dtype) if promote is None else promote


@pytest.mark.parametrize("key", sorted(FWD_CONFIGS))
@pytest.mark.parametrize("softmax", [0, 2, 3])
def test_forward_compiles_to_wgmma(key, softmax):
    ptx = _compile_forward(key, softmax).asm["ptx"]
    assert "wgmma.mma_async" in ptx  # the tensor-core model flashsim uses is wgmma's
    assert "ex2.approx.ftz.f32" in ptx and "div.full.f32" in ptx and "fma.rn.f32" in ptx


@pytest.mark.parametrize("key", sorted(FWD_CONFIGS))
def test_fp8_forward_pipelines_v(key):
    """FP8: with V's keys contiguous (gpu.flash passes it so) Triton loads V tiles by cp.async into a
    multi-buffered pipeline, like K's; from V as (N, d) it cannot, as e4m3 wgmma needs the keys contiguous
    in shared memory, so every V tile went through registers to be transposed (the contrast)."""

    def buffered(v_t):
        ttgir = _compile_forward(key, 0, dtype="fp8", v_t=v_t).asm["ttgir"]
        return len(re.findall(rf"local_alloc : \(\) -> !ttg.memdesc<{fwd_config('e4m3', *key).num_stages}x", ttgir))

    assert buffered(True) == 2  # K and V
    assert buffered(False) == 1  # K only


@pytest.mark.parametrize("d", sorted({d for d, _ in FWD_CONFIGS}))
def test_fp8_transpose_moves_16_bytes_at_a_time(d):
    """The transpose of FP8's V loads and stores 16 bytes a thread and instruction whatever N_K is (its
    rows padded to 16 keys; byte-wide stores were what made torch's copy slow)."""
    from gpu.flash import TRANSPOSE_BLOCK

    x = _ptr(DTYPES["fp8"])
    kern = _compile(transpose_keys, (x, x, 1001, 1008), dict(HEAD_DIM=d, BLOCK_N=TRANSPOSE_BLOCK), num_warps=4)
    ops = set(re.findall(r"\b(?:ld|st)\.global[.\w]*", kern.asm["ptx"]))
    assert ops == {"ld.global.v4.b32", "st.global.v4.b32"}, ops


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("key", sorted(FWD_CONFIGS))
def test_forward_compiles_for_one_query(key, dtype):
    """A call with one query and one key (N_Q = N_K = N_BLK = 1) compiles through ptxas for every tile and
    softmax, bf16 and FP8 (V transposed, as gpu.flash passes it).  Triton 3.6 makes an integer argument
    equal to 1 a constant unless the kernel says not to; with all three constant, ptxas 12.8 crashed
    (SIGSEGV) on d=64, causal, robust (found on the H100), and with N_K = N_BLK = 1 on FP8 at d=64 with
    128 x 64 tiles, 8 warps, causal, stabilised (not our tiles)."""
    for softmax in (0, 1, 2, 3):
        kern = _compile_forward(key, softmax, 1, dtype, v_t=dtype == "fp8")
        assert kern.asm["cubin"]  # ptxas ran
        assert ["N_K", "N_BLK"] == [name for name, t in kern.src.signature.items() if t == "constexpr"][:2]


def test_every_head_dim_has_forward_and_backward_tiles():
    from gpu.flash import HEAD_DIMS

    assert sorted({d for d, _ in FWD_CONFIGS}) == list(HEAD_DIMS) == sorted(BWD_CONFIGS)
    assert all((d, causal) in FWD_CONFIGS for d in HEAD_DIMS for causal in (False, True))


def _compile_backward(d, causal, n):
    """The dK/dV and dQ kernels, bf16, N_Q = N_K = `n`, with the head dim's tiles, as gpu.flash launches them."""
    cfg = BWD_CONFIGS[d]
    x, f = _ptr(torch.bfloat16), _ptr()
    const = dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (
        _compile(attn_bwd_dkdv, (x, x, x, x, f, f, x, x, 0.18, 0.125, n, n), const, **opts),
        _compile(attn_bwd_dq, (x, x, x, x, f, f, x, 0.18, 0.125, n, n), const, **opts),
    )


@pytest.mark.parametrize("d", sorted(BWD_CONFIGS))
def test_backward_compiles_to_wgmma(d):
    """wgmma in both backward kernels (a tile of fewer than 64 query rows would put the dQ kernel on mma.sync
    m16n8k16, as d=256's earlier 32-row tiles did)."""
    k = _compile_backward(d, True, 1000)
    assert "wgmma.mma_async" in k[0].asm["ptx"]
    ptx = k[1].asm["ptx"]
    cfg = BWD_CONFIGS[d]
    if cfg.block_m >= 64:
        assert "wgmma.mma_async" in ptx
    else:
        assert "wgmma.mma_async" not in ptx and "mma.sync.aligned.m16n8k16" in ptx


@pytest.mark.parametrize("d", sorted(BWD_CONFIGS))
def test_backward_compiles_for_one_query(d):
    """Both backward kernels compile through ptxas with N_Q = N_K = 1 made constants (as Triton's launcher
    makes an integer argument equal to 1), with and without causal masking: their masked and unmasked loops
    then fold to nothing or one block, the shape that crashed ptxas 12.8 in the forward."""
    for causal in (False, True):
        for k in _compile_backward(d, causal, 1):
            assert k.asm["cubin"]
            assert [name for name, t in k.src.signature.items() if t == "constexpr"][:2] == ["N_Q", "N_K"]


def _compile_overlap(d, causal, softmax, dtype="bf16", cfg=None, n=1000, promote=None):
    """The overlap kernel as gpu.flash launches it for `dtype` ('bf16', 'fp16' or 'fp8': e4m3, O in bf16,
    V transposed) and N_Q = N_K = `n`, with that dtype's tiles (or `cfg`) and gpu.flash.overlap_options;
    `promote`: PROMOTE_PV (None: gpu.flash's default)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from gpu.flash import overlap_options
    from gpu.kernels.fwd_overlap import attn_fwd_overlap

    cfg = cfg or fwd_config("e4m3" if dtype == "fp8" else dtype, d, causal)
    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp8": gl.float8e4nv}[dtype]
    v_t = dtype == "fp8"
    x = torch.empty(2 * n * d, dtype=DTYPES[dtype])  # two heads

    def desc(shape, block, row=None):  # row: the last dimension's stride, if not its size
        row = row or shape[-1]
        strides = [math.prod(shape[i + 1 : -1]) * row for i in range(len(shape) - 1)] + [1]
        return TensorDescriptor(x, shape, strides, block, gl.NVMMASharedLayout.get_default_for(block, gdt))

    kv = [1, cfg.block_n, d]
    descs = (
        desc([2 * n, d], [cfg.block_m, d]),
        desc([2, n, d], kv),  # V^T's rows padded to 16 keys, as gpu.flash
        desc([2, d, n], [1, d, cfg.block_n], -(-n // 16) * 16) if v_t else desc([2, n, d], kv),
    )
    args = (*descs, _ptr(torch.bfloat16 if v_t else DTYPES[dtype]), _ptr(), CONSTS, n, n)
    const = dict(
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=causal,
        SOFTMAX=softmax,
        STAGES=cfg.num_stages,
        V_T=v_t,
        PROMOTE_PV=_promote(dtype, promote),
    )
    return _compile(attn_fwd_overlap, args, const, **overlap_options(cfg, d, 1 if v_t else 2))


def _ptxas_log(kernel) -> str:
    """ptxas -v's report on a kernel compiled by `_compile` for sm_90a: the one its compile printed, or,
    for a kernel from Triton's cache, Triton's bundled ptxas run again on its PTX (skips the test without it)."""
    if "Used" in getattr(kernel, "ptxas_log", ""):
        return kernel.ptxas_log
    ptx = kernel.asm["ptx"]
    import subprocess
    import tempfile
    from pathlib import Path

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("Triton's ptxas is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        return subprocess.run(
            [str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr


#: (dtype, head dim, causal) where the overlap kernel runs with the dtype's default tiles (BLOCK_N == d)
OVERLAP_KEYS = sorted(
    [("bf16", *k) for k, c in FWD_CONFIGS.items() if c.block_n == k[0]]
    + [("fp8", *k) for k in FWD_CONFIGS if fwd_config("e4m3", *k).block_n == k[0]]
)
#: and FP8 on two compute warpgroups (128-row programs), measured but not the default (history/tried.md, "FP8 E4M3
#: forward")
OVERLAP_KEYS += [("fp8", 128, False, 128), ("fp8", 128, True, 128)]


@pytest.mark.parametrize("key", OVERLAP_KEYS)
@pytest.mark.parametrize("softmax", [0, 1, 2, 3])
def test_overlap_forward_compiles_without_serialised_wgmma(key, softmax):
    """The Gluon forward keeps its wgmmas asynchronous: ptxas serialises them (warning C7514) if any other
    instruction touches an in-flight accumulator, which would undo the overlap; spills stay at a few words.
    FP8 without P V's promotion: with it Triton adds each 32 keys' products while the next wgmma is in flight,
    which ptxas serialises (below)."""
    dtype, d, causal, *rows = key
    cfg = Config(rows[0], d, 8, 3) if rows else None
    kernel = _compile_overlap(d, causal, softmax, dtype, cfg, promote=False)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # tensor cores fed by TMA
    assert ("e4m3.e4m3" in ptx) == (dtype == "fp8")
    assert "ex2.approx.ftz.f32" in ptx and "div.full.f32" in ptx
    log = _ptxas_log(kernel)
    assert "C7514" not in log, log
    spilled = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spilled and max(spilled) <= 16, log  # at most a few registers (measured: 0-16 bytes)


def test_overlap_fp8_promotion_serialises_the_wgmmas():
    """What FP8's promoted P V costs the overlap kernel (docs/gpu.md): ptxas serialises its wgmmas (C7514), as
    the promotion's FP32 adds read a partial accumulator between a wgmma's issue and its wait, and at d = 128
    the second accumulator no longer fits the 128 registers (spills, C7511).  kernel='auto' never picks the
    overlap kernel for FP8 (gpu.configs.FP8_OVERLAP_FROM_KEYS is empty)."""
    from gpu.configs import FP8_OVERLAP_FROM_KEYS

    assert FP8_OVERLAP_FROM_KEYS == {}
    log = _ptxas_log(_compile_overlap(64, False, 3, "fp8", promote=True))
    assert "C7514" in log, log
    log = _ptxas_log(_compile_overlap(128, False, 3, "fp8", promote=True))
    assert "C7511" in log and max(int(n) for n in re.findall(r"(\d+) bytes spill stores", log)) > 0, log


@pytest.mark.parametrize("softmax", [0, 2, 3])
def test_overlap_64_row_programs_fit_two_an_sm(softmax):
    """One compute warpgroup a program (FP8's 64-row tiles): launched with at most 128 registers a thread and
    using at most half an SM's shared memory, so two programs' 8 warps fit an H100 SM, the compute warps
    raised to 232 and the load warps lowered to 24 by setmaxnreg, without spills.  Uncapped, ptxas gave
    every warp 255 (one program an SM, far slower: history/tried.md, "FP8 E4M3 forward").  Without P V's
    promotion, which the overlap kernel pays with spills and serialised wgmmas (the next test)."""
    from gpu.flash import SM_SHARED_BYTES

    k = _compile_overlap(128, False, softmax, "fp8", promote=False)
    ptx = k.asm["ptx"]
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232", ptx), "compute warps not raised to 232"
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24", ptx), "load warps not lowered to 24"
    assert 2 * (k.metadata.shared + 1024) <= SM_SHARED_BYTES, k.metadata.shared
    log = _ptxas_log(k)
    used = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    assert used and max(used) <= 128, log
    assert "Too many maxnreg" not in log, log
    assert max(int(n) for n in re.findall(r"(\d+) bytes spill stores", log)) == 0, log


#: PTX conversions from float32 that round P to its dtype, and how many values each converts
_P_CASTS = {
    "bf16": {"cvt.rn.bf16x2.f32": 2, "cvt.rn.bf16.f32": 1},
    "fp16": {"cvt.rn.f16x2.f32": 2, "cvt.rn.f16.f32": 1},
    "fp8": {"cvt.rn.satfinite.e4m3x2.f32": 2},
}
#: and what widens the cast P back to float32 for cast_sum's row sum, read from the packed register of the
#: conversion (steps.cast_and_widened: bf16 by a shift and the mask 0xFFFF0000, fp16 by cvt.f32.f16; E4M3: nothing,
#: its bits are decoded with integer and exact float32 operations, steps.e4m3_values)
_P_WIDENS = {"bf16": ("0xFFFF0000",), "fp16": ("cvt.f32.f16",), "fp8": ()}


def _rounded_to(ptx: str, dtype: str) -> int:
    """How many float32 values the PTX rounds to `dtype` (packed conversions count two)."""
    return sum(n * len(re.findall(re.escape(op) + r"\b", ptx)) for op, n in _P_CASTS[dtype].items())


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize("kernel", ["triton", "overlap"])
def test_cast_sum_sums_the_cast_p(dtype, kernel):
    """cast_sum (SOFTMAX 3) widens values of P's dtype back to float32 (the row sum of the cast P) and the
    standard softmax does not.  In the tl kernel it also rounds exactly as many float32 values to the dtype as
    the standard softmax (P's cast and O's), and bf16 and fp16 only by packed conversions, two values each: P is
    cast once, for P V and l alike.  (In the overlap kernel the
    compiler duplicates the softmax into both branches of the masked/unmasked test, so static counts differ
    there while each path still casts once.)"""
    d, causal = 64, True
    if kernel == "triton":
        ptx = {sm: _compile_forward((d, causal), sm, dtype=dtype, v_t=dtype == "fp8").asm["ptx"] for sm in (0, 3)}
        assert _rounded_to(ptx[3], dtype) == _rounded_to(ptx[0], dtype) > 0
        unpacked = {"bf16": "cvt.rn.bf16.f32", "fp16": "cvt.rn.f16.f32", "fp8": "cvt.rn.satfinite.e4m3.f32"}[dtype]
        assert not re.search(re.escape(unpacked) + r"\b", ptx[3])
    else:
        ptx = {sm: _compile_overlap(d, causal, sm, dtype).asm["ptx"] for sm in (0, 3)}
    for op in _P_WIDENS[dtype]:
        assert op not in ptx[0] and op in ptx[3], op
    assert "cvt.rn.f16x2.e4m3x2" not in ptx[3]  # Triton's own widening of an E4M3 tensor: wrong there


@pytest.mark.parametrize("d", [64, 128])
def test_fp8_cast_sum_packed_reads_l_from_conversions_of_its_own(d):
    """`Config(e4m3_sum="packed")` (E4M3_PACKED): l's E4M3 values by packed conversions, the pair the other way round
    from P's cast for P V (one more packed rounding of each two values, widened through fp16), and none of the
    arithmetic path's integer rounding; P V's operand is cast as before.  Its SASS: tests/gpu/test_fp8_unpack_sass.py
    (every unpack reads a pack)."""
    ptx = {p: _compile_forward((d, False), 3, dtype="fp8", v_t=True, packed=p).asm["ptx"] for p in (False, True)}
    packs = {p: len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx[p])) for p in ptx}
    assert packs[True] == 2 * packs[False] > 0
    assert "cvt.rn.f16x2.e4m3x2" in ptx[True] and "cvt.rn.f16x2.e4m3x2" not in ptx[False]
    standard = _compile_forward((d, False), 0, dtype="fp8", v_t=True, packed=True).asm["ptx"]
    assert "cvt.rn.f16x2.e4m3x2" not in standard  # the standard softmax sums P itself: the flag changes nothing


def _e4m3_wgmmas(ptx: str) -> tuple[int, int]:
    """(e4m3 wgmma instructions, those whose scale-d is the constant 0: D = A B, no accumulator read)."""
    w = [re.sub(r"\s+", " ", x) for x in re.findall(r"wgmma\.mma_async[^;]*\.e4m3\.e4m3[^;]*;", ptx)]
    return len(w), sum(x.endswith(", 0, 1, 1;") for x in w)


@pytest.mark.parametrize("kernel", ["triton", "overlap"])
def test_fp8_promotion_starts_every_pv_wgmma_from_zero(kernel):
    """PROMOTE_PV (Triton's max_num_imprecise_acc=32), the emulator's h100.WGMMA_FP8_PROMOTED: every k32 wgmma
    of P V computes its 32 keys' products from zero (scale-d the constant 0) and the result is added to acc
    by an FP32 add, with no FMA more than without; without it only the scores' first wgmma of a block starts
    from zero.  d = BLOCK_N = 64:
    P V and the scores take two k32 steps each."""

    def ptx(promote: bool) -> str:
        if kernel == "triton":
            return _compile_forward((64, False), 3, dtype="fp8", v_t=True, promote=promote).asm["ptx"]
        return _compile_overlap(64, False, 3, "fp8", promote=promote).asm["ptx"]

    plain, promoted = ptx(False), ptx(True)
    (n_u, zero_u), (n_p, zero_p) = _e4m3_wgmmas(plain), _e4m3_wgmmas(promoted)
    assert n_u == n_p > 0 and zero_u == n_u // 4  # half the wgmmas are the scores', half of those start at 0
    assert zero_p == zero_u + n_u // 2  # and now every P V wgmma too
    assert len(re.findall(r"\badd\.f32\b", promoted)) > len(re.findall(r"\badd\.f32\b", plain))
    # the rescale acc * alpha stays its own rounding (mul.rn): not fused into the first chunk's add as an FMA,
    # which the emulator would not model (what the H200 showed before the kernel said mul.rn)
    fmas = {p: len(re.findall(r"\bfma\.rn\.f32\b", x)) for p, x in (("plain", plain), ("promoted", promoted))}
    assert fmas["plain"] == fmas["promoted"], fmas
    assert "mul.rn.f32" in promoted


def test_overlap_caps_registers_only_where_two_programs_fit():
    """The 128-register cap where two 64-row programs' shared memory fits an SM (FP8 at d=128, bf16 at
    d=64), not for bf16 at d=128 (208 KiB a program), where it would only make ptxas spill."""
    from gpu.flash import overlap_options

    tiles = Config(64, 128, 4, 3)
    assert overlap_options(tiles, 128, 1).get("maxnreg") == 128
    assert "maxnreg" not in overlap_options(tiles, 128, 2)
    assert overlap_options(Config(64, 64, 4, 3), 64, 2).get("maxnreg") == 128
    assert "maxnreg" not in overlap_options(Config(128, 128, 8, 3), 128, 1)  # two compute warpgroups


_FOLD_CHECK = """
import numpy as np, torch, triton, triton.language as tl
from gpu.kernels.steps import count_at_least, row_max

@triton.jit
def k(X, R, C, T, K: tl.constexpr, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    rows = tl.arange(0, 16)
    x = tl.load(X + rows[:, None] * K + tl.arange(0, K)[None, :])
    thr = tl.load(T + rows)
    tl.store(R + rows, row_max(x, SOFTMAX, FOLD))
    tl.store(C + rows, count_at_least(x, thr, FOLD))  # the interpreter's path of the kernels' tie count

rng = np.random.default_rng(5)
pool = np.float32([-np.inf, -0.0, 0.0, 1.0, 2.0, -3.5, 7.0, np.nextafter(np.float32(7), np.float32(8))])
for K in (16, 64, 128, 256):
    for t in range(20):
        x = rng.choice(pool, (16, K)) if t % 2 else rng.standard_normal((16, K)).astype(np.float32)
        thr = (x.max(1) - np.float32(1e-3 if t % 4 < 2 else 0.0)).astype(np.float32)
        for fold in (False, True):  # plain and folded reductions (the standard softmax's max is always plain)
            r, c = torch.empty(16), torch.empty(16)
            k[(1,)](torch.from_numpy(x), r, c, torch.from_numpy(thr), K, t % 3, fold)
            assert np.array_equal(r.numpy(), x.max(1)), (K, t, fold)
            assert np.array_equal(c.numpy(), (x >= thr[:, None]).sum(1).astype(np.float32)), (K, t, fold)
print("folds ok")
"""


def test_folded_row_reductions_match_numpy_in_the_interpreter():
    """The row max and the kernels' tie count (gpu.kernels.steps.count_at_least, its interpreter path: the
    compiled one is inline PTX), tree-folded (the fixes in 64-key blocks, the overlap kernel) or plain, under
    Triton's interpreter, a fresh process (TRITON_INTERPRET is read at import): maxima and counts, ties, +-0 and
    -inf included, equal numpy's for 16 to 256 columns."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _FOLD_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "folds ok" in run.stdout, run.stderr[-3000:]


def test_forward_kernel_argument_is_checked():
    from gpu import flash

    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kernel: expected one of"):
        flash.forward(q, q, q, kernel="fast")


def test_softmax_constants_are_float32_roundings_and_cached_per_variant_and_scale():
    """The kernels' scalars (cached since every launch needs them, an immutable record) are the float32
    roundings of the variant's thresholds; another variant or scale gets its own values."""
    import numpy as np

    from flashsim.softmax import RobustSoftmax, StabilisedSoftmax
    from gpu import flash

    log2e = 1 / math.log(2)
    for scale in (0.125, 1 / math.sqrt(96), 0.3):
        for eps in (1e-3, 2.5e-3):
            c = flash.softmax_constants(StabilisedSoftmax(eps=eps, beta=3.0), scale)
            assert isinstance(c, SoftmaxConstants)
            assert c.qk_scale == float(np.float32(scale * log2e))
            assert c.eps_raw == float(np.float32(eps / scale)) and c.eps_t == float(np.float32(eps * log2e))
            assert c.beta == 3.0 and c.band_raw == 0.0
        r = RobustSoftmax(p_precision=11, max_shift=20.0)
        c = flash.softmax_constants(r, scale)
        assert c.band_raw == float(np.float32(r.band / scale)) and c.band_t == float(np.float32(r.band * log2e))
        assert c.max_shift_raw == float(np.float32(20.0 / scale))
    assert flash.softmax_constants(r, 0.3) is flash.softmax_constants(r, 0.3)  # cached
    with pytest.raises(ValueError, match="implement standard, stabilised, robust, cast_sum; got"):
        flash.softmax_constants(object(), 0.125)
    with pytest.raises(ValueError, match="count only unmasked"):
        flash.softmax_constants(StabilisedSoftmax(count_masked=True), 0.125)


def test_float32_constants_have_the_bits_flashsim_gives_them():
    """gpu.flash rounds the kernels' scalars to float32 by numpy's cast; flashsim, whose `triton_h100` policy
    repeats the kernels, rounds them by the emulator (flashsim.arith.constant under FP32).  The bits agree:
    for every constant of 41 variants (the standard one, 16 (eps, beta) of the stabilised, 24 (p_precision,
    beta, max_shift) of the robust) over 620 scales (1/sqrt(d) for d up to 512, and 10^-6 to 10^3), and for
    float64 values across float32's whole range (random bit patterns; ties and their neighbours; values past
    the largest float32; subnormals and underflow to zero; signed zeros)."""
    import numpy as np

    import emufloat as ef
    from emufloat import FP32
    from flashsim import arith
    from flashsim.attention import LOG2E
    from flashsim.softmax import RobustSoftmax, StabilisedSoftmax, StandardSoftmax
    from flashsim.specs import Op
    from gpu import flash

    def bits(x: float) -> int:
        return int(np.float32(x).view(np.uint32))

    rng = np.random.default_rng(7)
    scales = [1 / math.sqrt(d) for d in range(1, 513)] + list(10.0 ** rng.uniform(-6, 3, 108))
    variants = [StandardSoftmax()]
    variants += [StabilisedSoftmax(eps=e, beta=b) for e in (1e-3, 2.5e-3, 1e-5, 0.37) for b in (1.5, 2.0, 3.0, 7.25)]
    variants += [
        RobustSoftmax(p_precision=p, beta=b, max_shift=m)
        for p in (4, 8, 11)
        for b in (1.5, 2.0)
        for m in (0.5, 8.0, 20.0, 64.0)
    ]
    emulated = {}
    compared = 0
    for scale in scales:
        for variant in variants:
            c = flash.softmax_constants(variant, scale)
            raw, scaled = 1.0 / scale, LOG2E
            exact = dict(qk_scale=scale * LOG2E)
            if isinstance(variant, StabilisedSoftmax):
                exact.update(eps_raw=variant.eps * raw, eps_t=variant.eps * scaled, beta=variant.beta)
            elif isinstance(variant, RobustSoftmax):
                exact.update(
                    beta=variant.beta,
                    band_raw=variant.band * raw,
                    band_t=variant.band * scaled,
                    max_shift_raw=variant.max_shift * raw,
                    max_shift_t=variant.max_shift * scaled,
                )
            for name, x in exact.items():
                if x not in emulated:
                    emulated[x] = float(arith.constant(x, Op(FP32)))
                assert bits(getattr(c, name)) == bits(emulated[x]), (scale, variant, name, x)
                compared += 1
    assert compared > 100_000
    # the cast itself, numpy's against the emulator's, on arrays
    pats = rng.integers(0, 2**64, 200_000, dtype=np.uint64).view(np.float64)
    f32 = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f32 = f32[np.isfinite(f32)].astype(np.float64)
    up = np.nextafter(f32.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    ties = f32 + (up - f32) / 2  # exactly halfway between neighbouring float32s (exact in float64)
    big = float(np.finfo(np.float32).max)
    special = np.array(
        [
            0.0,
            -0.0,
            big,
            -big,
            big * (1 + 2**-25),
            big * (1 + 2**-24),
            1e39,
            -1e39,
            2.0**-149,
            2.0**-150,
            2.0**-150 * 1.0000001,
            2.0**-151,
            1e-46,
            2.0**-126,
            2.0**-126 * (1 - 2**-24),
        ]
    )
    x = np.concatenate([pats, f32, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), special])
    x = x[np.isfinite(x)]
    with np.errstate(over="ignore"):
        ours = x.astype(np.float32)
    theirs = np.asarray(ef.quantize(x, FP32), np.float32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


# ---- live, on a GPU ------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softmax", ["standard", "stabilised", "robust", "cast_sum"])
@pytest.mark.parametrize("d", [64, 256])
def test_live_against_fp64(dtype, causal, softmax, d):
    from gpu import flash

    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 333, d, device="cuda", dtype=dt) for _ in range(3))
    do = torch.randn_like(q)
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    o = flash.attention(qq, kk, vv, causal=causal, softmax=softmax)
    o.backward(do)
    from studies.device.run_attention import reference

    o64, _, g64 = reference(q, k, v, causal, 1 / math.sqrt(d), do)
    tol = 2e-2 if dtype == "bf16" else 4e-3
    assert (o.double() - o64).abs().max().item() < tol
    for g, r in zip((qq.grad, kk.grad, vv.grad), g64, strict=True):
        assert (g.double() - r).abs().max().item() < 4 * tol


@pytest.mark.gpu
@cuda
def test_live_kernel_equals_emulator():
    from flashsim.crosscheck import crosscheck
    from gpu.crosscheck import live_run
    from gpu.crosscheck.cases import Case, inputs

    for case in [
        Case(100, 100, 64, "bf16", True, "robust", "repeated", 1),
        Case(77, 130, 128, "fp16", False, "stabilised", "sink", 2),
        Case(90, 150, 256, "bf16", True, "robust", "repeated", 3),
        Case(70, 200, 256, "fp16", False, "standard", "random", 4),
        Case(90, 150, 256, "bf16", True, "cast_sum", "large", 5),
        Case(77, 130, 64, "fp16", False, "cast_sum", "random", 6),
    ]:
        x = inputs(case)
        run = live_run(
            x["q"][0], x["k"][0], x["v"][0], x["do"][0], dtype=case.dtype, causal=case.causal, softmax=case.softmax
        )
        rep = crosscheck(run)
        assert rep.identical, str(rep)


@pytest.mark.gpu
@cuda
def test_live_run_records_the_launch_and_the_tiles_its_policy_has():
    """live_run keeps what ran: the card and its SM count, the versions, the shapes and the kernels' tiles, the
    same tiles its policy reference names."""
    import numpy as np
    import torch

    from gpu.crosscheck import live_run

    rng = np.random.default_rng(7)
    q, k, v, do = (rng.standard_normal((2, 77, 64)).astype(np.float32) for _ in range(4))
    run = live_run(q, k, v, do, dtype="fp16", causal=True, softmax="cast_sum", debug=False)
    launch = run.launch
    assert launch["kernel"] == "gpu.flash" and launch["device"] == torch.cuda.get_device_name()
    assert launch["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    assert (launch["batch_heads"], launch["n_q"], launch["n_k"], launch["head_dim"]) == (2, 77, 77, 64)
    fwd, bwd = launch["kernel_info"]["fwd"], launch["kernel_info"]["bwd"]
    kw = run.policy.kwargs
    assert (fwd["block_m"], fwd["block_n"], fwd["num_warps"]) == (kw["block_m"], kw["block_n"], kw["num_warps"])
    assert (bwd["block_m"], bwd["block_n"]) == (kw["bwd_block_m"], kw["bwd_block_n"])


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_live_overlap_kernel_equals_triton_kernel(d, causal):
    """The Gluon forward computes the tl forward's bits (O and LSE), ragged lengths and adversarial inputs."""
    from gpu import flash
    from gpu.crosscheck import same_bits
    from studies.device.run_attention import kind_inputs

    for kind, n, dtype in (("repeated", 1000, "bf16"), ("sink", 517, "fp16"), ("large", 4096 - 3, "bf16")):
        q, k, v, _ = kind_inputs(kind, dtype, (1, 2, n, d), n)
        for sm in flash.SOFTMAX_IDS:
            a = flash.forward(q, k, v, causal=causal, softmax=sm, kernel="overlap")
            b = flash.forward(q, k, v, causal=causal, softmax=sm, kernel="triton")
            assert same_bits(a[:2], b[:2]), (kind, sm)


def _fp8_cases(d: int):
    """(kind, N_q, N_k, q, k, v) in e4m3 on the GPU: adversarial inputs, ragged lengths (rows of V^T padded
    to 16 keys) down to one key."""
    from gpu import flash
    from studies.device.run_attention import kind_inputs

    for kind, nq, nk in (("repeated", 1000, 1000), ("sink", 517, 333), ("large", 333, 150), ("random", 64, 1)):
        q, k, v, _ = kind_inputs(kind, "bf16", (1, 2, max(nq, nk), d), nq + nk)
        yield (
            kind,
            nq,
            nk,
            q[:, :, :nq].to(flash.FP8).contiguous(),
            *(x[:, :, :nk].to(flash.FP8).contiguous() for x in (k, v)),
        )


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_live_fp8_cast_sum_equals_emulator_and_is_the_default(d, causal):
    """The FP8 forward's default softmax is cast_sum, and its O and LSE are flashsim's CastSumSoftmax under the
    e4m3 policy bit for bit, on sharp rows ('large') and others; the standard softmax's O differs on them."""
    from flashsim.crosscheck import KernelRun, crosscheck
    from gpu import flash
    from gpu.crosscheck import bits_of
    from gpu.policies import kernel_policy_ref, kernel_variant

    differ = 0
    for kind, nq, nk, q8, k8, v8 in _fp8_cases(d):
        o, lse, _ = flash.forward(q8, k8, v8, causal=causal)
        named = flash.forward(q8, k8, v8, causal=causal, softmax="cast_sum")
        assert torch.equal(o, named[0]) and torch.equal(lse, named[1]), (kind, "the default is not cast_sum")
        differ += not torch.equal(o, flash.forward(q8, k8, v8, causal=causal, softmax="standard")[0])
        if nq * nk > 517 * 333:
            continue  # the emulator takes long there; the recorded cast_sum cases cover such rows
        x = [t[0].float().cpu().numpy() for t in (q8, k8, v8)]
        run = KernelRun(
            q=x[0],
            k=x[1],
            v=x[2],
            dtype="e4m3",
            causal=causal,
            sm_scale=1 / math.sqrt(d),
            softmax=kernel_variant("cast_sum", "e4m3"),
            policy=kernel_policy_ref("e4m3", d, causal),
            outputs={"o": bits_of(o[0]), "lse": bits_of(lse[0])},
        )
        rep = crosscheck(run)
        assert rep.identical, (kind, nq, nk, str(rep))
    assert differ >= 2


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("d", [64, 128])
def test_live_fp8_overlap_kernel_equals_triton_kernel(d):
    """FP8 in the Gluon forward (V transposed, read by a TMA descriptor that ends at N_K, 64-row programs two
    an SM) computes the tl forward's bits: ragged lengths down to one key, adversarial inputs, both maskings,
    every softmax."""
    from gpu import flash
    from gpu.crosscheck import same_bits

    for kind, nq, nk, q8, k8, v8 in _fp8_cases(d):
        for causal in (False, True):
            for sm in flash.SOFTMAX_IDS:
                want = flash.forward(q8, k8, v8, causal=causal, softmax=sm, kernel="triton")[:2]
                got = flash.forward(q8, k8, v8, causal=causal, softmax=sm, kernel="overlap")[:2]
                assert same_bits(got, want), (kind, nq, nk, causal, sm)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("d", [64, 128])
def test_live_fp8_transposed_v_keeps_the_bits(d):
    """FP8 reads V transposed (gpu.flash.V_TRANSPOSED): reading V as given instead (`v_transposed=False`),
    on the same tiles, gives the same O and LSE bits; ragged lengths (a row of V^T padded to 16 keys),
    adversarial inputs, both maskings, every softmax."""
    from gpu import flash
    from gpu.crosscheck import same_bits

    for kind, nq, nk, q8, k8, v8 in _fp8_cases(d):
        for causal in (False, True):
            for sm in flash.SOFTMAX_IDS:
                want = flash.forward(q8, k8, v8, causal=causal, softmax=sm)[:2]
                got = flash.forward(q8, k8, v8, causal=causal, softmax=sm, v_transposed=False)[:2]
                assert same_bits(got, want), (kind, nq, nk, causal, sm)


@pytest.mark.gpu
@cuda
def test_live_direct_launch_follows_specialisations():
    """gpu.launch reuses a compiled kernel only for its specialisation: after aligned calls, tensors
    starting 2 bytes off a 16-byte boundary and lengths of 1 and 17 (not divisible by 16) get their own
    kernels, and every call gives the bits of Triton's own launch path (`with gpu.launch.direct(False):`)."""
    import numpy as np

    from gpu import flash, launch
    from gpu.crosscheck import bits_of

    torch.manual_seed(1)
    for n in (64, 1, 17, 64):
        for offset in (0, 1):
            q, k, v, do = (
                torch.randn(1 * 2 * n * 64 + offset, device="cuda", dtype=torch.bfloat16)[offset:].view(1, 2, n, 64)
                for _ in range(4)
            )
            o, lse, _ = flash.forward(q, k, v, causal=True, softmax="robust", kernel="triton")  # compiles
            flash.backward(q, k, v, o, lse, do, causal=True)
            got = []
            for direct in (True, False):
                with launch.direct(direct):
                    o, lse, _ = flash.forward(q, k, v, causal=True, softmax="robust", kernel="triton")
                    got.append((o, lse, *flash.backward(q, k, v, o, lse, do, causal=True)))
            for x, y in zip(*got, strict=True):
                assert np.array_equal(bits_of(x), bits_of(y)), (n, offset)
    keys = list(flash._FWD._compiled)
    assert len({key[1] for key in keys}) >= 6  # (n: 64, 1, 17) x (aligned, not): each its own kernel


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kernel", ["triton", "overlap"])
def test_live_more_heads_than_one_grid_holds(kernel):
    """B*H = 65568 (CUDA caps the grid's y axis, where the heads are, at 65535) runs as several launches of
    consecutive heads: a head in the first or the last launch gets the bits it gets in a batch of its own
    (bf16 forward and backward, FP8 forward)."""
    import numpy as np

    from gpu import flash
    from gpu.crosscheck import bits_of, same_bits

    torch.manual_seed(2)
    b, h, n, d = 4098, 16, 8, 128
    assert b * h > flash.HEADS_PER_LAUNCH
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse, _ = flash.forward(q, k, v, causal=True, softmax="robust", kernel=kernel)
    grads = flash.backward(q, k, v, o, lse, do, causal=True)
    for part in (slice(0, 1), slice(b - 3, b)):  # heads 0-15 (first launch), 65520-65567 (second)
        o1, lse1, _ = flash.forward(q[part], k[part], v[part], causal=True, softmax="robust", kernel=kernel)
        grads1 = flash.backward(q[part], k[part], v[part], o1, lse1, do[part], causal=True)
        for name, x, y in zip(
            ("o", "lse", "dq", "dk", "dv", "delta"), (o, lse, *grads), (o1, lse1, *grads1), strict=True
        ):
            assert np.array_equal(bits_of(x[part]), bits_of(y)), (kernel, part, name)
    q8, k8, v8 = (x.to(flash.FP8) for x in (q, k, v))  # FP8: V transposed, and its descriptor per launch
    o, lse, _ = flash.forward(q8, k8, v8, causal=True, softmax="robust", kernel=kernel)
    if kernel == "overlap":
        assert same_bits((o, lse), flash.forward(q8, k8, v8, causal=True, softmax="robust", kernel="triton")[:2])
    for part in (slice(0, 1), slice(b - 3, b)):
        one = flash.forward(q8[part], k8[part], v8[part], causal=True, softmax="robust", kernel=kernel)
        assert same_bits((o[part], lse[part]), one[:2]), (kernel, part, "fp8")


@pytest.mark.gpu
@cuda
def test_live_empty_inputs():
    """No queries, no keys or no heads give outputs of the right shapes (no keys: O = 0 and LSE = -inf as SDPA
    returns, dQ = 0; no queries: dK = dV = 0); the overlap kernel, whose TMA descriptors need a non-empty
    tensor, is refused with an error that says so."""
    from gpu import flash

    for q_shape, k_shape in (
        ((1, 2, 0, 128), (1, 2, 5, 128)),
        ((1, 2, 5, 128), (1, 2, 0, 128)),
        ((0, 2, 5, 128), (0, 2, 5, 128)),
    ):
        q = torch.randn(q_shape, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(k_shape, device="cuda", dtype=torch.bfloat16)
        o, lse, _ = flash.forward(q, k, k, softmax="robust")
        dq, dk, dv, _ = flash.backward(q, k, k, o, lse, torch.randn_like(o))
        assert o.shape == dq.shape == q.shape and lse.shape == q.shape[:3] and dk.shape == dv.shape == k.shape
        if q.numel() and not k.numel():
            assert not o.any() and (lse == float("-inf")).all() and not dq.any()
            sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, k)
            assert torch.equal(o, sdpa), "SDPA's convention for no keys"
        if k.numel() and not q.numel():
            assert not dk.any() and not dv.any()
        with pytest.raises(ValueError, match="non-empty"):
            flash.forward(q, k, k, kernel="overlap")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("d", [64, 128, 256])
def test_live_causal_rows_never_see_later_keys(d):
    """Causal masking selects -inf: a later key whose score is far above the row's own (the tutorial's -1e6
    bias let it win) or NaN (it made the earlier rows of its tile NaN) leaves earlier rows alone, in both
    forward kernels where they run."""
    from gpu import flash

    kernels = ("triton", "overlap") if flash.FWD_CONFIGS[(d, True)].block_n == d else ("triton",)
    q, k, v = (torch.zeros(1, 1, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q[0, 0, 0], k[0, 0, 0], v[0, 0, 1] = -300.0, 300.0, 1.0  # row 0's only key scores about -1e6 (log2 units)
    torch.manual_seed(3)
    x = [torch.randn(1, 2, 200, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    bad = x[1].clone()
    bad[0, 1, 150, 5] = float("nan")
    for kernel in kernels:
        for softmax in flash.SOFTMAX_IDS:
            o = flash.forward(q, k, v, causal=True, softmax=softmax, kernel=kernel)[0]
            assert o[0, 0, 0, 0] == 0.0, (kernel, softmax)
            want = flash.forward(*x, causal=True, softmax=softmax, kernel=kernel)
            got = flash.forward(x[0], bad, x[2], causal=True, softmax=softmax, kernel=kernel)
            for w, g in zip(want[:2], got[:2], strict=True):
                assert torch.equal(w[:, 0], g[:, 0]) and torch.equal(w[:, 1, :150], g[:, 1, :150]), (kernel, softmax)
            assert torch.isnan(got[0][:, 1, 150:]).all(), (kernel, softmax)
