"""GPU calibration probes: measure what an H100 computes for exp2/exp, fp32 division, tl.dot and tl.sum.

Run all of them with `bash studies/device/run_probes.sh` (`OUT` set), i.e. `python -m studies.probes.run --out
$OUT`.
The layout is described in `docs/probes.md`.

Modules that import torch/triton (they define kernels): `exp2`, `division`, `mma`, `reduction`,
`torchutil`, `env`; `compile_check` compiles all kernels for sm_90 without a GPU (needs triton). Modules that
need no torch (and so are testable on a machine without it): `common`, `trees`, `run` (numpy and the
standard library), `formats` and `mma_cases` (also emufloat, whose `FusedBlock`/`matmul` is the
tensor-core model the stress tiles are compared with).
"""

PROBES = ("exp2", "division", "mma", "reduction")
