"""flashsim.devices.h100_softmax: the softmax steps of a block as one kernel give the bits of the step-by-step path."""

from __future__ import annotations

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim import fused
from flashsim.devices import h100_softmax


def _inputs(kind: str, m: int, n: int, d: int = 64, heads: tuple[int, ...] = ()):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((*heads, r, d)) for r in (m, n, n))
    if kind == "large":
        q *= 40.0
    elif kind == "ties":  # repeated row maxima within and across K/V blocks
        k[..., :, :] = k[..., :1, :]
    elif kind == "specials":
        q[..., m - 1, 5] = np.inf
        k[..., 70, 2] = np.nan
        v[..., 9, 1] = -np.inf
    elif kind == "tiny":
        q *= 1e-30
    return tuple(ef.quantize(x, "bf16").astype(np.float32) for x in (q, k, v))


def _both(monkeypatch, *args, **kw):
    one = fs.flash_forward(*args, **kw)
    with monkeypatch.context() as mp:
        mp.setattr(fused, "KERNELS", [])
        steps = fs.flash_forward(*args, **kw)
    return one, steps


@pytest.mark.parametrize("kind", ["random", "large", "ties", "specials", "tiny"])
@pytest.mark.parametrize("shape", [(256, 256), (200, 130), (1, 128)])
def test_fused_step_same_bits(monkeypatch, kind, shape):
    q, k, v = _inputs(kind, *shape)
    one, steps = _both(monkeypatch, q, k, v, "triton_h100")
    assert one.o.tobytes() == steps.o.tobytes()
    assert one.lse.tobytes() == steps.lse.tobytes()


def test_fused_step_heads_at_once(monkeypatch):
    q, k, v = _inputs("random", 1, 128, heads=(3, 5))
    one, steps = _both(monkeypatch, q, k, v, "triton_h100", sm_scale=1.0)
    assert one.o.tobytes() == steps.o.tobytes() and one.lse.tobytes() == steps.lse.tobytes()


def test_fused_step_stepper_states(monkeypatch):
    q, k, v = _inputs("random", 128, 256)
    fast = fs.step_rows(q, k, v, "triton_h100", rows=range(0, 128), trace=False).run()
    with monkeypatch.context() as mp:
        mp.setattr(fused, "KERNELS", [])
        slow = fs.step_rows(q, k, v, "triton_h100", rows=range(0, 128), trace=False).run()
    for a, b in zip(fast.steps, slow.steps, strict=True):
        for f in ("m", "alpha", "p_exp", "p", "l", "acc", "s_max"):
            assert np.asarray(getattr(a, f)).tobytes() == np.asarray(getattr(b, f)).tobytes(), f


def test_fused_step_not_for_other_policies():
    from flashsim.attention import Pipeline
    from flashsim.policy import get_policy
    from flashsim.softmax import get_softmax

    for pol, softmax in (("fa2", "standard"), ("qiu_yao", "standard"), ("triton_h100", "robust")):
        pipe = Pipeline(get_policy(pol), 0.125, get_softmax(softmax), None)
        assert fused.for_pipeline(pipe, False) is None
    pipe = Pipeline(get_policy("triton_h100"), 0.125, get_softmax("standard"), None)
    assert h100_softmax.applies(pipe, False) and not h100_softmax.applies(pipe, True)
