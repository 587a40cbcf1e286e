"""q, K, V (and dO) from users' files, checked before anything is computed.

Files: ``.npz`` (arrays named q, k, v[, do]), ``.npy`` (one array, or q, k, v stacked on a first axis of 3)
and ``.pt``/``.pth`` (torch: a dict, a list of tensors or one stacked tensor; needs torch).  Every float
dtype is taken with its bits: numpy's, ml_dtypes' (an ml_dtypes array saved by ``np.save`` comes back as
raw bytes: 2-byte ones are bfloat16, the only 2-byte ml_dtypes float; 1-byte ones need ``input_format``
to say which FP8/FP4 format they hold) and torch's (bf16 and float8 included).  Integer, bool and complex
arrays are refused, as the API refuses them: converting integers is the caller's decision.

Every problem raises :class:`InputError` naming the argument (``--data``, ``--q``...) and what is accepted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from emufloat.formats import as_format, format_of_dtype
from emufloat.interop import is_torch_tensor, to_numpy


class InputError(ValueError):
    """Bad user input; the message starts with the argument it is about."""


RAW_1BYTE_FORMATS = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1", "e2m3", "e3m2")


def raw_dtype(input_format: str | None, arg: str = "--input-format") -> np.dtype | None:
    """The ml_dtypes dtype named by ``--input-format`` (for arrays saved as raw bytes), or None."""
    if input_format is None:
        return None
    try:
        fmt = as_format(input_format)
    except (ValueError, KeyError, TypeError):
        fmt = None
    if fmt is None or fmt.dtype is None:
        raise InputError(
            f"{arg}: expected a format with an ml_dtypes dtype, e.g. bf16, {', '.join(RAW_1BYTE_FORMATS)};"
            f" got {input_format!r}"
        )
    return np.dtype(fmt.dtype)


def as_float(x: object, arg: str, name: str, raw: np.dtype | None = None) -> np.ndarray:
    """``x`` (numpy, ml_dtypes or torch) as a float array of the same bits, or an InputError."""
    try:
        x = to_numpy(x, name)
    except TypeError as exc:
        raise InputError(f"{arg}: {exc}") from None
    arr = np.asarray(x)
    if arr.dtype.kind == "V" and not arr.dtype.names:  # ml_dtypes values saved by np.save lose their dtype
        if raw is not None and raw.itemsize == arr.dtype.itemsize:
            return arr.view(raw)
        if raw is None and arr.dtype.itemsize == 2:
            import ml_dtypes

            return arr.view(ml_dtypes.bfloat16)
        raise InputError(
            f"{arg}: {name} holds raw {arr.dtype.itemsize}-byte values (an ml_dtypes array saved with "
            f"np.save loses its type); name their format with --input-format (1-byte: "
            f"{', '.join(RAW_1BYTE_FORMATS)})"
        )
    if arr.dtype.kind in "iub":
        raise InputError(
            f"{arg}: {name} holds {arr.dtype} values; flashsim takes floating-point arrays (numpy, "
            "ml_dtypes or torch floats), as its API does: convert them first, e.g. x.astype(np.float32)"
        )
    if format_of_dtype(arr.dtype) is None:
        raise InputError(
            f"{arg}: {name} has dtype {arr.dtype}; expected a real floating-point array (float16/32/64, "
            "an ml_dtypes float such as bfloat16 or float8_e4m3fn, or a torch float tensor)"
        )
    return arr


def _read_npz(path: Path, arg: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {key: z[key] for key in z.files}
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted files fails in many ways: each means a bad file
        raise InputError(
            f"{arg}: cannot read {path} as .npz ({type(exc).__name__}: {exc}); expected a file written by numpy.savez"
        ) from None


def _read_npy(path: Path, arg: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - as for .npz
        raise InputError(
            f"{arg}: cannot read {path} as .npy ({type(exc).__name__}: {exc}); expected a file written "
            "by numpy.save (object arrays are refused)"
        ) from None


def _read_pt(path: Path, arg: str) -> object:
    try:
        import torch
    except ImportError:
        raise InputError(
            f"{arg}: {path.name} is a PyTorch file but torch is not installed; install torch or save the "
            "arrays with numpy (.npy/.npz)"
        ) from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for unreadable files
        raise InputError(f"{arg}: cannot read {path} with torch.load ({type(exc).__name__}: {exc})") from None


def _file(name: str, arg: str, suffixes: tuple[str, ...]) -> tuple[Path, str]:
    path = Path(name)
    if not path.exists():
        raise InputError(f"{arg}: no such file: {name}")
    if not path.is_file():
        raise InputError(f"{arg}: {name} is not a file")
    suffix = path.suffix.lower()
    if suffix not in suffixes:
        raise InputError(f"{arg}: unsupported file type {suffix or '(none)'} of {name}; expected {', '.join(suffixes)}")
    return path, suffix


def load_named(
    name: str, arg: str, wanted: tuple[str, ...], optional: tuple[str, ...] = (), raw: np.dtype | None = None
) -> dict[str, np.ndarray]:
    """The arrays ``wanted`` (and those of ``optional`` present) from one file: .npz with those names, .npy or
    .pt stacked on a first axis of len(wanted), or a .pt dict or list."""
    path, suffix = _file(name, arg, (".npz", ".npy", ".pt", ".pth"))
    names = wanted + optional
    if suffix == ".npz":
        z = _read_npz(path, arg)
        keys = {key.lower(): key for key in z}
        missing = [n for n in wanted if n not in keys]
        if missing:
            raise InputError(
                f"{arg}: {path.name} lacks array(s) {', '.join(missing)}; it has "
                f"{', '.join(z) or 'none'} (expected {', '.join(wanted)}"
                + (f", optionally {', '.join(optional)}" if optional else "")
                + ")"
            )
        return {n: as_float(z[keys[n]], arg, n, raw) for n in names if n in keys}
    obj = _read_npy(path, arg) if suffix == ".npy" else _read_pt(path, arg)
    if isinstance(obj, dict):
        keys = {str(key).lower(): key for key in obj}
        missing = [n for n in wanted if n not in keys]
        if missing:
            raise InputError(f"{arg}: {path.name} lacks {', '.join(missing)} (keys: {list(obj)})")
        return {n: as_float(obj[keys[n]], arg, n, raw) for n in names if n in keys}
    if isinstance(obj, (list, tuple)):
        if len(obj) not in (len(wanted), len(names)):
            raise InputError(
                f"{arg}: {path.name} holds {len(obj)} objects; expected {len(wanted)} ({', '.join(wanted)})"
            )
        return {n: as_float(x, arg, n, raw) for n, x in zip(names, obj, strict=False)}
    if not (isinstance(obj, np.ndarray) or is_torch_tensor(obj)):
        raise InputError(f"{arg}: {path.name} holds a {type(obj).__name__}; expected arrays {', '.join(wanted)}")
    arr = as_float(obj, arg, "the array", raw)
    if arr.ndim < 3 or arr.shape[0] not in (len(wanted), len(names)):
        raise InputError(
            f"{arg}: a single array must hold {', '.join(wanted)} stacked on a first axis of "
            f"{len(wanted)} (same shapes), got shape {arr.shape}; use .npz for different shapes"
        )
    return {n: arr[i] for i, n in enumerate(names[: arr.shape[0]])}


def load_one(name: str, arg: str, what: str, raw: np.dtype | None = None) -> np.ndarray:
    """One array from a .npy or .pt file (``--q FILE``)."""
    path, suffix = _file(name, arg, (".npy", ".pt", ".pth"))
    obj = _read_npy(path, arg) if suffix == ".npy" else _read_pt(path, arg)
    if not (isinstance(obj, np.ndarray) or is_torch_tensor(obj)):
        raise InputError(f"{arg}: {path.name} holds a {type(obj).__name__}, not an array or tensor")
    return as_float(obj, arg, what, raw)


def check_attention_shapes(arg: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray | None = None) -> None:
    """Shapes that attention accepts: (..., M, d), (..., N, d), (..., N, dv) [, dO (..., M, dv)], M, N, d >= 1."""
    arrays = {"q": q, "k": k, "v": v} | ({"do": do} if do is not None else {})
    for name, x in arrays.items():
        if x.ndim < 2:
            raise InputError(f"{arg}: {name} has shape {x.shape}; expected (..., rows, head_dim)")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise InputError(f"{arg}: q, k, v leading (batch, head) axes differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise InputError(f"{arg}: q and k head dims differ: q {q.shape}, k {k.shape} (scores are q k^T)")
    if k.shape[-2] != v.shape[-2]:
        raise InputError(f"{arg}: k and v numbers of keys differ: k {k.shape}, v {v.shape}")
    for name, x, what in (("q", q, "query row"), ("k", k, "key"), ("q", q, "head dim"), ("v", v, "value dim")):
        axis = -1 if what in ("head dim", "value dim") else -2
        if x.shape[axis] < 1:
            raise InputError(f"{arg}: {name} has shape {x.shape}: at least one {what} needed")
    if do is not None and do.shape != (*q.shape[:-1], v.shape[-1]):
        raise InputError(
            f"{arg}: do has shape {do.shape}; expected {(*q.shape[:-1], v.shape[-1])} (q's rows, v's head dim)"
        )


def load_qkv(
    data: str | None, q: str | None, k: str | None, v: str | None, input_format: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v from ``--data`` (one file) or from ``--q/--k/--v`` (one file each), shapes checked."""
    raw = raw_dtype(input_format)
    if data is not None:
        if any(x is not None for x in (q, k, v)):
            raise InputError("--data: give either --data or --q/--k/--v, not both")
        arrs = load_named(data, "--data", ("q", "k", "v"), raw=raw)
        out, arg = (arrs["q"], arrs["k"], arrs["v"]), "--data"
    else:
        given = {"q": q, "k": k, "v": v}
        if not any(given.values()):
            raise InputError("--data: no input given")
        missing = [f"--{n}" for n, f in given.items() if f is None]
        if missing:
            raise InputError(f"{', '.join(missing)}: --q, --k and --v go together (or use --data)")
        out = tuple(load_one(f, f"--{n}", n, raw) for n, f in given.items())
        arg = "--q/--k/--v"
    check_attention_shapes(arg, *out)
    return out


def pick_head(q: np.ndarray, k: np.ndarray, v: np.ndarray, head: str | None) -> tuple[tuple, np.ndarray, ...]:
    """Index the leading (batch, head) axes: ``--head 1,3``; default all zeros."""
    lead = q.shape[:-2]
    if head is None:
        idx = (0,) * len(lead)
    else:
        try:
            idx = tuple(int(x) for x in head.split(",")) if head.strip() else ()
        except ValueError:
            raise InputError(f"--head: expected comma-separated integers, got {head!r}") from None
        if len(idx) != len(lead):
            raise InputError(f"--head: the inputs have {len(lead)} leading axes {lead}, got {len(idx)} index(es)")
        for i, (j, n) in enumerate(zip(idx, lead, strict=True)):
            if not -n <= j < n:
                raise InputError(f"--head: index {j} out of range for axis {i} of size {n}")
    return idx, q[idx], k[idx], v[idx]


__all__ = [
    "InputError",
    "RAW_1BYTE_FORMATS",
    "as_float",
    "check_attention_shapes",
    "load_named",
    "load_one",
    "load_qkv",
    "pick_head",
    "raw_dtype",
]
