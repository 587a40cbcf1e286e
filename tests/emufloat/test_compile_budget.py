"""What a cold first run compiles: the shared routines that kernels call (not inline) compile one copy each,
whatever their callers pass; a copy per caller would cost seconds of every first run."""

import numba as nb
import numpy as np

from emufloat import _accum_kernels, _core
from emufloat.hw import h100  # noqa: F401  (registers the presets named below)


@nb.njit
def _constant_arguments(params):
    """Callers that pass constants (literal 0, False) where other callers pass variables."""
    enc, _fl = _core.round_pack(0, np.int64(3), 0, False, _core.NO_CARRY_REF, params, 0, 0, 0)
    return enc, _accum_kernels._round_sum(3.0, 0.0, params, 0)


def test_shared_routines_compile_once_for_constant_arguments():
    params = _core.FP32_PARAMS
    by_python = (  # called from Python: int64 arguments
        _core.round_pack(0, 3, 0, False, _core.NO_CARRY_REF, params, 0, 0, 0)[0],
        _accum_kernels._round_sum(3.0, 0.0, params, 0),
    )
    assert _constant_arguments(params) == by_python == (np.float32(3.0).view(np.uint32), 3.0)
    assert len(_core._round_pack.signatures) == 1, _core._round_pack.signatures
    assert len(_accum_kernels._round_dd.signatures) == 1, _accum_kernels._round_dd.signatures


def test_the_matmul_models_share_one_general_chain():
    """The untraced kernel sends rows with NaN or infinite operands to the traced kernel's general chain."""
    import emufloat as ef

    a = np.ones((4, 32), np.float32)
    a[0, 0] = np.nan
    a, b = ef.quantize(a, "bf16"), ef.quantize(np.ones((32, 4), np.float32), "bf16")
    fast = ef.matmul(a, b, "h100_wgmma_bf16")
    traced = ef.matmul(a, b, "h100_wgmma_bf16", trace=ef.Trace())
    np.testing.assert_array_equal(fast, traced)
    assert np.isnan(fast[0]).all() and (fast[1:] == 32).all()
    # copies compiled in this process: on a cold cache (a fresh checkout, as in CI) both kernels compile here
    # and would count two if the untraced one passed literal constants; on a warm cache they load from disk
    assert len(_accum_kernels._block_chain.signatures) <= 1, _accum_kernels._block_chain.signatures
