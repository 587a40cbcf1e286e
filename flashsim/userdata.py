"""q, K, V (and dO) from users' files, checked before anything is computed.

Files: ``.npz`` (arrays named q, k, v[, do]), ``.npy`` (one array, or q, k, v stacked on a first axis of 3)
and ``.pt``/``.pth`` (torch: a dict, a list of tensors or one stacked tensor; needs torch).  A typed array
(numpy, ml_dtypes, torch: bf16 and float8 included) keeps its bits and its format.  ``np.save``/``np.savez``
write bfloat16 and most float8/6/4 arrays as raw bytes (descr '<V2', '<V1') and float8_e5m2 as '<f1', which
numpy cannot load; both come back as raw bytes: 2-byte ones are bfloat16 (the only 2-byte ml_dtypes float),
1-byte ones need ``input_format``.  ``input_format`` is for raw bytes only: a typed array of another format
is refused.  Files are never unpickled.  Integer, bool and complex arrays are refused, as the API refuses
them: converting integers is the caller's decision.

Every problem raises `InputError` naming the argument (``--data``, ``--q``...) and what is accepted.
"""

from __future__ import annotations

import ast
import math
import re
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
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


# ml_dtypes' integer types are numpy dtypes of kind 'V', like its floats: refused as integers, not read as raw bytes
_ML_INT_TYPES = tuple(
    getattr(ml_dtypes, n) for n in ("int1", "int2", "int4", "uint1", "uint2", "uint4") if hasattr(ml_dtypes, n)
)


def is_raw_bytes(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is untyped bytes (numpy's void, what ``np.save`` leaves of an ml_dtypes array) rather
    than a real type: ml_dtypes' bfloat16 and most float8/6/4 dtypes have kind 'V' too, but their own type."""
    return dtype.type is np.void and dtype.names is None and dtype.subdtype is None


def _format_name(dtype: np.dtype) -> str:
    fmt = format_of_dtype(dtype)
    return f"{fmt.name} ({dtype})" if fmt is not None and fmt.name != str(dtype) else str(dtype)


def as_float(x: object, arg: str, name: str, raw: np.dtype | None = None) -> np.ndarray:
    """``x`` (numpy, ml_dtypes or torch) as a float array of the same bits, or an InputError.

    Raw bytes take the format ``raw`` names (``--input-format``; without it 2-byte raw is bfloat16); a typed
    array keeps its own, and is refused when ``raw`` names another: reinterpreting typed bits is never right."""
    try:
        x = to_numpy(x, name)
    except TypeError as exc:
        raise InputError(f"{arg}: {exc}") from None
    arr = np.asarray(x)
    dtype = arr.dtype
    if is_raw_bytes(dtype):  # ml_dtypes values saved by np.save lose their dtype
        if raw is not None and raw.itemsize == dtype.itemsize:
            return arr.view(raw)
        if raw is not None:
            raise InputError(
                f"--input-format: {name} in {arg} holds raw {dtype.itemsize}-byte values, but --input-format "
                f"{_format_name(raw)} is a {raw.itemsize}-byte format"
            )
        if dtype.itemsize == 2:
            return arr.view(ml_dtypes.bfloat16)
        raise InputError(
            f"{arg}: {name} holds raw {dtype.itemsize}-byte values (an ml_dtypes array saved with "
            f"np.save/np.savez loses its type); name their format with --input-format (1-byte: "
            f"{', '.join(RAW_1BYTE_FORMATS)})"
        )
    if dtype.kind in "iub" or dtype.type in _ML_INT_TYPES:
        raise InputError(
            f"{arg}: {name} holds {dtype} values; flashsim takes floating-point arrays (numpy, "
            "ml_dtypes or torch floats), as its API does: convert them first, e.g. x.astype(np.float32)"
        )
    fmt = format_of_dtype(dtype) if dtype.names is None else None
    if fmt is None:
        raise InputError(
            f"{arg}: {name} has dtype {dtype}; expected a real floating-point array (float16/32/64, "
            "an ml_dtypes float such as bfloat16 or float8_e4m3fn, or a torch float tensor)"
        )
    if raw is not None and fmt != format_of_dtype(raw):
        raise InputError(
            f"--input-format: {name} in {arg} is a typed {_format_name(dtype)} array, not raw bytes, and "
            f"--input-format {_format_name(raw)} differs; --input-format only names the format of arrays "
            "saved as raw bytes: drop it (a typed array keeps its format)"
        )
    return arr


_NPY_HEADER_MAX = 10000  # numpy's own limit on the header of a file it does not trust
_NPY_LENGTH = {(1, 0): ("<H", "latin1"), (2, 0): ("<I", "latin1"), (3, 0): ("<I", "utf8")}


def _unknown_float_width(descr: object) -> int | None:
    """The width of a descr numpy has no dtype for but ml_dtypes writes (``'<f1'``: float8_e5m2), or None."""
    if not isinstance(descr, str):
        return None
    m = re.fullmatch(r"[<>|=]?f(\d+)", descr)
    if m is None:
        return None
    try:
        np.dtype(descr)
    except TypeError:
        return int(m.group(1))
    return None


def _raw_npy_header(fp: BinaryIO) -> tuple[tuple[int, ...], bool, int] | None:
    """(shape, fortran_order, width) of a .npy header whose descr is a float numpy cannot build, with ``fp``
    then at the data; None for every other header (numpy's reader takes those, and reports what is wrong)."""
    try:
        version = np.lib.format.read_magic(fp)
        length_type, encoding = _NPY_LENGTH[version]
        size = struct.calcsize(length_type)
        (length,) = struct.unpack(length_type, fp.read(size))
        if length > _NPY_HEADER_MAX:
            return None
        header = ast.literal_eval(fp.read(length).decode(encoding))  # literals only: never runs code
    except (ValueError, KeyError, SyntaxError, struct.error, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    if not (isinstance(header, dict) and header.keys() == {"descr", "fortran_order", "shape"}):
        return None
    shape, fortran = header["shape"], header["fortran_order"]
    width = _unknown_float_width(header["descr"])
    if width is None or not isinstance(fortran, bool) or not isinstance(shape, tuple):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return None
    return shape, fortran, width


def read_npy(fp: BinaryIO) -> np.ndarray:
    """One array from an open, seekable .npy stream, never unpickling: numpy's reader with
    ``allow_pickle=False``, except that a descr numpy has no dtype for (``'<f1'``, what ``np.save`` writes for
    ml_dtypes' float8_e5m2) comes back as raw bytes of its width, for ``--input-format`` to name."""
    start = fp.tell()
    found = _raw_npy_header(fp)
    if found is None:
        fp.seek(start)
        return np.lib.format.read_array(fp, allow_pickle=False)
    shape, fortran, width = found
    count = math.prod(shape)
    data = fp.read(count * width)
    if len(data) != count * width:
        raise ValueError(f"the file holds {len(data)} data bytes; its header says {shape} x {width} bytes")
    arr = np.frombuffer(bytearray(data), dtype=np.dtype(f"V{width}"))
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _read_npz(path: Path, arg: str, names: tuple[str, ...]) -> tuple[list[str], dict[str, np.ndarray]]:
    """(every array name in the file, the arrays of ``names`` present, matched case-insensitively)."""
    try:
        with zipfile.ZipFile(path) as z:
            members = {info.filename.removesuffix(".npy"): info for info in z.infolist() if not info.is_dir()}
            keys = {key.lower(): key for key in members}
            arrays = {}
            for n in names:
                if n in keys:
                    with z.open(members[keys[n]]) as fp:
                        arrays[n] = read_npy(fp)
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted files fails in many ways: each means a bad file
        raise InputError(
            f"{arg}: cannot read {path} as .npz ({type(exc).__name__}: {exc}); expected a file written by numpy.savez"
        ) from None
    return list(members), arrays


def _read_npy(path: Path, arg: str) -> np.ndarray:
    try:
        with open(path, "rb") as fp:
            return read_npy(fp)
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
        files, z = _read_npz(path, arg, names)
        missing = [n for n in wanted if n not in z]
        if missing:
            raise InputError(
                f"{arg}: {path.name} lacks array(s) {', '.join(missing)}; it has "
                f"{', '.join(files) or 'none'} (expected {', '.join(wanted)}"
                + (f", optionally {', '.join(optional)}" if optional else "")
                + ")"
            )
        return {n: as_float(z[n], arg, n, raw) for n in names if n in z}
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
    "is_raw_bytes",
    "load_named",
    "load_one",
    "load_qkv",
    "pick_head",
    "raw_dtype",
    "read_npy",
]
