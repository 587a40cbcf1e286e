"""Atomically summed gradients (flashsim.atomics): a dQ summed over the K/V blocks in another order than the
policy's is reported as identical up to the order of atomic adds, every order tried up to 5 blocks and by the
proven bound beyond; a dQ no order gives is not.  Both kinds of turns: FA2's atomicAdd of block products (SDPA
flash) and the memory-efficient kernel's blocks continuing the buffer under a lock."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import flashsim as fs
from flashsim.crosscheck import KernelRun, crosscheck, to_bits
from flashsim.inputs import make_inputs
from gpu.policies import sdpa_efficient_policy, sdpa_flash_policy

POLICIES = {
    "flash": lambda n: sdpa_flash_policy("bf16", 64, n, n),
    "efficient": lambda n: sdpa_efficient_policy("bf16", 64, n),
}
#: the kernel, keys (every order tried with at most 5 blocks: FA2's are 128 keys, the memory-efficient's 64), the
#: GPU's other order
CASES = [("flash", 384, True, "reverse"), ("flash", 896, False, "reverse")]
CASES += [("efficient", 192, True, "forward"), ("efficient", 512, False, "forward")]


def _run(n: int, order: str, corrupt: bool = False, kernel: str = "flash") -> KernelRun:
    """A backward run whose dQ took the K/V blocks in ``order`` (the GPU's choice, made here by the emulator's own
    tiled backward in that order); ``corrupt`` doubles one element."""
    pol = POLICIES[kernel](n)
    x = make_inputs("random", n, n, 64, "bf16", 21)
    q, k, v, do = (x[name][None] for name in ("q", "k", "v", "do"))
    f = fs.flash_forward(q, k, v, pol)
    b = fs.flash_backward(q, k, v, f.o, f.lse, do, pol)
    gpu = fs.flash_backward(q, k, v, f.o, f.lse, do, pol, kv_order=order)
    dq = to_bits(gpu.dq, "bf16")
    if corrupt:
        dq = dq.copy()
        dq[0, 5, 7] = to_bits(np.float32([2 * float(gpu.dq[0, 5, 7]) + 1]), "bf16")[0]
    outputs = {"o": to_bits(f.o, "bf16"), "lse": to_bits(f.lse, None), "dq": dq}
    outputs |= {"dk": to_bits(b.dk, "bf16"), "dv": to_bits(b.dv, "bf16"), "delta": to_bits(b.delta, None)}
    return KernelRun(q, k, v, "bf16", False, 0.125, fs.get_softmax("standard"), pol, outputs, do=do)


@pytest.mark.parametrize("kernel, n, exhaustive, order", CASES)
def test_another_order_of_the_atomic_adds_is_admitted(kernel, n, exhaustive, order):
    report = crosscheck(_run(n, order, kernel=kernel))
    a = report.atomic["dq"]
    assert not report.identical and report.identical_up_to_atomic_order, str(report)
    assert a.ok and a.exhaustive == exhaustive and a.identical < a.n
    assert "identical up to the order of atomic adds" in str(report)
    if exhaustive:
        assert 0 < a.order_dependent < a.n


@pytest.mark.parametrize("kernel, n, exhaustive, order", CASES)
def test_a_value_no_order_gives_is_a_mismatch(kernel, n, exhaustive, order):
    report = crosscheck(_run(n, order, corrupt=True, kernel=kernel))
    a = report.atomic["dq"]
    assert not report.identical_up_to_atomic_order and a.admitted == a.n - 1
    assert "1 of" in str(a) and "no order of the atomic adds gives" in str(a)


def test_non_atomic_outputs_are_not_excused():
    run = _run(384, "reverse")
    pol = run.resolve_policy()
    plain = dataclasses.replace(pol, name="x", dq=dataclasses.replace(pol.dq, atomic=False))
    report = crosscheck(dataclasses.replace(run, policy=plain))
    assert report.atomic == {} and not report.identical_up_to_atomic_order
