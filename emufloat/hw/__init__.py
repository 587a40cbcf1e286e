"""Hardware models, a room per device: what one GPU generation computes where it differs from IEEE.

The generic emulator (``emufloat``'s top level) knows formats, rounding, exact operations and the generic
accumulation ([`emufloat.FusedBlock`][emufloat.FusedBlock]), function and reduction-tree
([`emufloat.ReductionTree`][emufloat.ReductionTree])
models.  A room here gives them one device's parameters and calibration data:

* [`emufloat.hw.h100`][emufloat.hw.h100] — the NVIDIA H100 under Triton 3.6;
* [`emufloat.hw.libdevice`][emufloat.hw.libdevice] — CUDA's libdevice functions (IEEE FP32 operations: any NVIDIA GPU).
* `emufloat.hw.cublas` — the accumulation of cuBLAS's bf16 GEMM kernels on sm90 (imported on its own).

``import emufloat`` imports none of them.  A new device is a sibling package ``emufloat/hw/<device>`` with its
own ``data`` folder (loaded through [`emufloat.hw.calibration`][emufloat.hw.calibration]), built on
[`emufloat.lowlevel`][emufloat.lowlevel] and
emufloat's other public modules only (``tests/emufloat/test_device_api.py`` checks every room).  Its accumulation
presets register with [`emufloat.accum.register()`][emufloat.accum.register] when it is imported; a room of the package
lists
their names in ``emufloat.accum``'s table of built-in rooms too, so that ``emufloat.matmul(a, b, name)``
imports the room on first use.
"""

from . import h100, libdevice

__all__ = ["h100", "libdevice"]
