"""The cross-check of our Triton kernels against the emulator, in one place.

- `gpu.crosscheck.cases`: the recorded grid of cases (shapes, dtype, causal, softmax, input kind, seed)
  and their inputs, regenerated from the seed with numpy.
- `gpu.crosscheck.recorded`: the recorded outputs (package data, gpu/data, or a device recording's
  folder) as [`KernelRun`][flashsim.crosscheck.KernelRun] objects, each carrying the policy of its launch
  ([`gpu.policies.kernel_policy_ref`][gpu.policies.kernel_policy_ref]).
- `gpu.crosscheck.live`: the kernels run on this machine's GPU and packaged the same way; torch,
  Triton and a GPU are needed only there.
- `gpu.crosscheck.kernels`: any kernel `kernel(q, k, v, causal, sm_scale) -> (O, LSE)` run on the GPU and
  packaged as a kernel run against a policy of your choice; PyTorch SDPA with a chosen backend as one.
- `gpu.crosscheck.upstream`: Triton's fused-attention tutorial and Qiu & Yao's attention.py, from the files you
  name, as kernels with their backward and their policies.
- `gpu.crosscheck.others`: the recorded grid of other people's kernels (Triton's tutorial, SDPA).
- `gpu.crosscheck.cli`: `python -m gpu.crosscheck`.

The comparison itself is kernel-agnostic and lives in [`flashsim.crosscheck`][flashsim.crosscheck] (numpy only: any
kernel's recorded run against any policy; [`KernelRun`][flashsim.crosscheck.KernelRun],
[`crosscheck`][flashsim.crosscheck.crosscheck], [`first_divergence`][flashsim.crosscheck.first_divergence],
[`save_run`][flashsim.crosscheck.save_run], [`load_run`][flashsim.crosscheck.load_run]).  A recorded case's outputs are
rerun under the `triton_h100` policy of the kernel's tiles and compared per output (the fraction of bit-identical
elements, an ulp histogram, the first divergent step).  NaN payloads are reported as such: the GPU's `cvt` keeps payload
bits, emufloat returns the canonical quiet NaN unless the policy models the encoding.
"""

from .cases import Case, backward_cases, forward_cases, fp8_cases, inputs
from .cli import main
from .kernels import SDPA_BACKENDS, kernel_run, sdpa
from .live import bits_of, live_cases, live_run, same_bits
from .recorded import DATA, RECORDED_FILES, case_run, compare, load_device_folder, load_recorded, recorded_runs

__all__ = [
    "Case",
    "DATA",
    "RECORDED_FILES",
    "SDPA_BACKENDS",
    "backward_cases",
    "bits_of",
    "case_run",
    "compare",
    "forward_cases",
    "fp8_cases",
    "inputs",
    "kernel_run",
    "live_cases",
    "live_run",
    "load_device_folder",
    "load_recorded",
    "main",
    "recorded_runs",
    "same_bits",
    "sdpa",
]
