"""gpu: the project's Triton attention kernels (forward and backward, standard / stabilised / robust
softmax), calibration probes, and the cross-check of emufloat/flashsim against the GPU.

`gpu.flash` and `gpu.kernels` need torch and triton (the `gpu` extra); `gpu.crosscheck.cases`,
`gpu.configs` and `gpu.crosscheck` need only numpy and the emulator, so the CPU test suite checks the
recorded GPU results with them.  Importing gpu compares the installed torch, Triton and CUDA with what the
modelled kernels were calibrated on (`gpu.versions`) and warns once (`gpu.versions.CalibrationWarning`)
where a kernel that can run here was calibrated on another version.
"""

from .versions import warn_once as _warn_once

_warn_once()
