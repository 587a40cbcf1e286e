"""flashsim policies of the kernels the project models, one module per kernel (numpy and the emulator only: no
torch needed):

- `.our_kernels`: our Triton kernels (`gpu.kernels`), `triton_policy`, `kernel_policy`;
- `.triton_tutorial`: Triton's fused-attention tutorial, `tutorial_policy` (and `tutorial_policy_for` a launch);
- `.sdpa_flash`, `.sdpa_efficient`, `.sdpa_cudnn`: PyTorch SDPA's backends;
- `.flex_attention`: PyTorch's FlexAttention compiled by Inductor, `flex_policy`;
- `.flash_attn4`: FlashAttention-4 (`flash-attn-4`, CuTe DSL) on Hopper, `fa4_policy`;
- `.qiu_yao`: Qiu & Yao's pure-PyTorch FlashAttention-2 under CUDA bf16 autocast, `qiu_yao`.

Each names what it was calibrated on (`gpu.versions.CALIBRATED_ON`, which `import gpu` checks).  The
policies are entry points of the `flashsim.policies` group (`triton_h100`, `qiu_yao`) and the policy
functions of the `flashsim.policy_functions` group, so that flashsim and saved runs find them by name
(`"gpu.policies:triton_policy"` with its arguments) without importing gpu first; importing this package also
registers the functions under those names.
"""

from flashsim.crosscheck import register_launch_check
from flashsim.policy import register_policy_function

from ..configs import (
    DEFAULT_PROMOTE_PV,
    DEFAULT_SOFTMAX,
    KERNEL_FORMATS,
    default_promote_pv,
    default_softmax,
    kernel_format,
    kernel_output_format,
    kernel_variant,
)
from ..versions import CALIBRATED_ON, PACKAGES, calibration_mismatch
from .flash_attn4 import FA4_BWD_TILES, FA4_TILES, fa4_policy
from .flex_attention import flex_policy
from .our_kernels import TRITON_H100, kernel_policy, kernel_policy_args, kernel_policy_ref, triton_policy
from .qiu_yao import QIU_YAO, cublas_alignment, qiu_yao_policy
from .sdpa_cudnn import sdpa_cudnn_policy
from .sdpa_efficient import EFFICIENT_BWD_TILES, EFFICIENT_TILES, efficient_key_splits, sdpa_efficient_policy
from .sdpa_flash import (
    FA2_BWD_TILES,
    FA2_TILES,
    H100_SM_COUNT,
    fa2_num_splits,
    fa2_split_block_n,
    sdpa_flash_policy,
)
from .triton_tutorial import tutorial_policy, tutorial_policy_for


def launch_calibration(policy, launch: dict) -> str | None:
    """A run's launch against the versions its policy was calibrated on (`CALIBRATED_ON`): why the match may not
    carry over to other builds, or None; registered with flashsim.crosscheck, so that a saved run checked on any
    machine says so."""
    info = launch.get("kernel_info") or {}  # a library a kernel brings says its version there (fa4: flash-attn-4)
    return calibration_mismatch(policy.name, {pkg: launch.get(pkg, info.get(pkg)) for pkg in PACKAGES})


register_launch_check(launch_calibration)
register_launch_check(cublas_alignment)

#: the policy functions a file may name, as "gpu.policies:NAME" with keyword arguments
FUNCTIONS = (
    triton_policy,
    kernel_policy,
    tutorial_policy,
    sdpa_flash_policy,
    sdpa_efficient_policy,
    sdpa_cudnn_policy,
    flex_policy,
    fa4_policy,
    qiu_yao_policy,
)
for _fn in FUNCTIONS:
    register_policy_function(_fn, target=f"{__name__}:{_fn.__name__}")

__all__ = [
    "CALIBRATED_ON",
    "DEFAULT_PROMOTE_PV",
    "DEFAULT_SOFTMAX",
    "EFFICIENT_BWD_TILES",
    "EFFICIENT_TILES",
    "FA4_BWD_TILES",
    "FA4_TILES",
    "FA2_BWD_TILES",
    "FA2_TILES",
    "FUNCTIONS",
    "H100_SM_COUNT",
    "KERNEL_FORMATS",
    "QIU_YAO",
    "TRITON_H100",
    "calibration_mismatch",
    "cublas_alignment",
    "default_promote_pv",
    "default_softmax",
    "efficient_key_splits",
    "fa4_policy",
    "flex_policy",
    "qiu_yao_policy",
    "fa2_num_splits",
    "fa2_split_block_n",
    "kernel_format",
    "kernel_output_format",
    "kernel_policy",
    "kernel_policy_args",
    "kernel_policy_ref",
    "kernel_variant",
    "launch_calibration",
    "sdpa_cudnn_policy",
    "sdpa_efficient_policy",
    "sdpa_flash_policy",
    "triton_policy",
    "tutorial_policy",
    "tutorial_policy_for",
]
