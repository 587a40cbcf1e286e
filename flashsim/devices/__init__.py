"""What particular GPUs and kernels compute, as the objects flashsim's policies name: importing this package
registers them (flashsim imports it; a device or kernel of your own is a module of the same shape, anywhere).

- `.h100`: Triton's kernels on the H100/H200 (sm_90): the recorded ``tl.sum`` trees for l and delta,
  ``div.full.f32`` and ``rcp.approx``, and the special-function unit's exp2 and log2 with what CUDA and Triton
  build on them.
- `.cuda_libs`: CUDA's libraries: libdevice's ``expf``, ``logf``, ``log2f`` and PyTorch's CUDA row sums.
- `.sm80_quads`: kernels on ``mma.sync`` (FlashAttention-2, cuDNN, PyTorch's memory-efficient kernel),
  whose rows are held by the four threads of a quad: their partial row sums and FA2's delta.
"""

from . import cuda_libs, h100, sm80_quads

__all__ = ["cuda_libs", "h100", "sm80_quads"]
