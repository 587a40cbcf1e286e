"""Block kernels: the softmax steps of one K/V block as one call, for the policies a kernel says it computes.

`flashsim.attention.kv_steps()` runs a block's steps (max, subtract, exp, the row sum and its update, the P cast,
the rescale) one emufloat call at a time.  A `BlockKernel` computes them all at once for pipelines its
``applies`` accepts, with the same bits; device modules register theirs (`flashsim.devices.h100_softmax`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class BlockKernel(NamedTuple):
    """``applies(pipe, masks)``: whether it computes an untraced block of this `flashsim.attention.Pipeline`
    (``masks``: the kernel applies a mask in it); ``step(pipe, s, m_old, lsum, acc)``: (P as the exp step returned
    it, P as cast, m, alpha, acc rescaled), with ``lsum.l`` and ``pipe.max_input`` updated, or None (nothing
    changed) where it declines the operands."""

    name: str
    applies: Callable
    step: Callable


KERNELS: list[BlockKernel] = []


def register(kernel: BlockKernel) -> None:
    """Add a block kernel (one of a name)."""
    KERNELS[:] = [k for k in KERNELS if k.name != kernel.name] + [kernel]


def for_pipeline(pipe, masks: bool) -> BlockKernel | None:
    """The first registered kernel that computes the pipeline's blocks, or None."""
    return next((k for k in KERNELS if k.applies(pipe, masks)), None)
