"""Arrays from other libraries as numpy arrays of the same bits: torch tensors of every float dtype.

numpy has no bfloat16 or float8, so ``tensor.numpy()`` refuses them; `to_numpy()` reinterprets the
tensor's bits as the ml_dtypes dtype of the same format instead, so nothing is rounded on the way.
torch is never imported here: a tensor is recognised by its type's module.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# torch dtype name -> the numpy/ml_dtypes dtype with the same encoding
TORCH_TO_NUMPY = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
}
_INT_OF_WIDTH = {8: "int64", 4: "int32", 2: "int16", 1: "uint8"}


def is_torch_tensor(x: object) -> bool:
    """Whether ``x`` is a torch.Tensor (without importing torch)."""
    return any(c.__module__.startswith("torch") and c.__name__ == "Tensor" for c in type(x).__mro__)


def to_numpy(x: object, argname: str = "x") -> object:
    """A torch tensor as a numpy array with the same bits (bf16 and float8 as ml_dtypes arrays, on the CPU,
    detached); anything else unchanged.  Integer and bool tensors become integer arrays, which the
    arithmetic refuses as it refuses integer numpy arrays; complex and packed dtypes are refused here."""
    if not is_torch_tensor(x):
        return x
    t = x.detach()
    name = str(t.dtype).removeprefix("torch.")
    if t.is_floating_point():
        if name not in TORCH_TO_NUMPY:
            raise TypeError(
                f"{argname}: torch dtype {t.dtype} has no emufloat format; accepted: "
                f"{', '.join('torch.' + n for n in TORCH_TO_NUMPY)}"
            )
        target = TORCH_TO_NUMPY[name]
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if name in ("float64", "float32", "float16"):
            return t.numpy()
        import torch  # a tensor exists, so torch is importable

        raw = t.view(getattr(torch, _INT_OF_WIDTH[target.itemsize])).numpy()
        return raw.view(target)
    if t.is_complex() or name.startswith(("float4", "quint", "qint", "complex")):
        raise TypeError(f"{argname}: torch dtype {t.dtype} is not a real floating-point type")
    return t.cpu().numpy()


__all__ = ["TORCH_TO_NUMPY", "is_torch_tensor", "to_numpy"]
