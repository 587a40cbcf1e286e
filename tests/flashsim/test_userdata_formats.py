"""Users' files keep the bits and the type they hold: every float format through every path of flashsim.userdata.

Expected bits are the bits the test wrote (uint views of arrays made here), never the loader's own output.
Paths: .npz, stacked .npy, .pt (dict, list, stacked tensor) through `--data`, and one file each through
`--q/--k/--v`.  What `np.save` writes for ml_dtypes arrays (raw bytes, or `'<f1'` for float8_e5m2) is
checked against the file's own header, and `--input-format` is checked to name raw bytes only.
"""

from __future__ import annotations

import ast
import io
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from flashsim.userdata import InputError, as_float, load_one, load_qkv, read_npy

# format name (as --input-format takes it) -> its dtype; every emufloat format that has one
DTYPES = {
    "fp64": np.dtype(np.float64),
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "e3m2": np.dtype(ml_dtypes.float6_e3m2fn),
    "e2m3": np.dtype(ml_dtypes.float6_e2m3fn),
    "e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
}
WIDTH_BITS = {"e3m2": 6, "e2m3": 6, "e2m1": 4}  # sub-byte formats: codes use the low bits of their byte
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
NUMPY_TYPED = ("fp64", "fp32", "fp16")  # np.save keeps these types; it writes ml_dtypes ones as raw bytes
TORCH_FORMAT = {  # torch dtype name -> the format of its bits
    "float64": "fp64",
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "e4m3fn",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
}
TORCH_DTYPES = tuple(TORCH_FORMAT)


def bits(fmt: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Unsigned codes of `fmt` (every code of the narrow formats appears, NaN patterns included)."""
    dtype = DTYPES[fmt]
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype.itemsize == 1:
        codes = np.arange(1 << WIDTH_BITS.get(fmt, 8))
        picked = np.concatenate([codes, rng.choice(codes, max(n - codes.size, 0))])[:n]
        return rng.permutation(picked).astype(np.uint8).reshape(shape)
    u = UINT[dtype.itemsize]
    return rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True).reshape(shape)


def qkv_bits(fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v bit patterns; narrow formats get enough elements to hold every code."""
    m, n, d = (16, 16, 16) if DTYPES[fmt].itemsize == 1 else (4, 6, 3)
    return bits(fmt, (m, d), 1), bits(fmt, (n, d), 2), bits(fmt, (n, d), 3)


def typed(b: np.ndarray, fmt: str) -> np.ndarray:
    return b.view(DTYPES[fmt])


def assert_bits(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], fmt: str) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == DTYPES[fmt], (g.dtype, fmt)
        assert g.shape == w.shape
        np.testing.assert_array_equal(g.view(w.dtype), w)


def npy_header(path: Path) -> dict:
    """The header of a .npy file, read here by hand (magic, version, length, literal dict)."""
    raw = path.read_bytes()
    assert raw[:6] == b"\x93NUMPY"
    size = 2 if raw[6] == 1 else 4
    (length,) = struct.unpack("<H" if size == 2 else "<I", raw[8 : 8 + size])
    return ast.literal_eval(raw[8 + size : 8 + size + length].decode("latin1"))


def one_line_error(exc: pytest.ExceptionInfo, argument: str, *words: str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert msg.startswith(argument + ":"), msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


# ---- what numpy writes --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(set(DTYPES) - set(NUMPY_TYPED)))
def test_np_save_drops_ml_dtypes_types(tmp_path, fmt):
    """The facts the loader handles: bfloat16 and the float8/6/4 types are saved as void bytes, except
    float8_e5m2 (kind 'f' in ml_dtypes 0.7), saved as '<f1', a descr numpy itself cannot load."""
    np.save(tmp_path / "a.npy", typed(bits(fmt, (4,), 0), fmt))
    descr = npy_header(tmp_path / "a.npy")["descr"]
    width = DTYPES[fmt].itemsize
    if DTYPES[fmt].kind == "f":
        assert descr == f"<f{width}"
        with pytest.raises(ValueError, match="descr"):
            np.load(tmp_path / "a.npy", allow_pickle=False)
    else:
        assert descr == f"<V{width}"
        assert np.load(tmp_path / "a.npy", allow_pickle=False).dtype == np.dtype(f"V{width}")


# ---- round trips, --data ------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(DTYPES))
def test_npz_round_trip(tmp_path, fmt):
    want = qkv_bits(fmt)
    np.savez(tmp_path / "d.npz", **{n: typed(b, fmt) for n, b in zip("qkv", want, strict=True)})
    assert_bits(load_qkv(str(tmp_path / "d.npz"), None, None, None, fmt), want, fmt)
    if fmt in (*NUMPY_TYPED, "bf16"):  # typed numpy floats, and 2-byte raw read as bf16 by default
        assert_bits(load_qkv(str(tmp_path / "d.npz"), None, None, None), want, fmt)
    else:
        with pytest.raises(InputError) as exc:
            load_qkv(str(tmp_path / "d.npz"), None, None, None)
        one_line_error(exc, "--data", "--input-format", "1-byte")


@pytest.mark.parametrize("fmt", list(DTYPES))
def test_npy_stacked_round_trip(tmp_path, fmt):
    b = bits(fmt, (3, 2, 5, 4), 7)
    np.save(tmp_path / "d.npy", typed(b, fmt))
    assert_bits(load_qkv(str(tmp_path / "d.npy"), None, None, None, fmt), (b[0], b[1], b[2]), fmt)


@pytest.mark.parametrize("fmt", ["e5m2", "e4m3fn", "bf16"])
def test_fortran_order_raw_npy(tmp_path, fmt):
    b = np.asfortranarray(bits(fmt, (3, 4, 5), 11))
    np.save(tmp_path / "d.npy", typed(b, fmt))
    assert npy_header(tmp_path / "d.npy")["fortran_order"] is True
    assert_bits(load_qkv(str(tmp_path / "d.npy"), None, None, None, fmt), (b[0], b[1], b[2]), fmt)


@pytest.mark.parametrize("torch_name", TORCH_DTYPES)
def test_pt_round_trip(tmp_path, torch_name):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, torch_name):
        pytest.skip(f"this torch has no {torch_name}")
    fmt = TORCH_FORMAT[torch_name]
    want = qkv_bits(fmt)
    tdt = getattr(torch, torch_name)
    itype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[DTYPES[fmt].itemsize]
    signed = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[DTYPES[fmt].itemsize]
    tensors = [torch.from_numpy(b.view(signed).copy()).view(itype).view(tdt) for b in want]
    torch.save(dict(zip("qkv", tensors, strict=True)), tmp_path / "dict.pt")
    torch.save(tensors, tmp_path / "list.pt")
    for name in ("dict.pt", "list.pt"):
        assert_bits(load_qkv(str(tmp_path / name), None, None, None), want, fmt)
        assert_bits(load_qkv(str(tmp_path / name), None, None, None, fmt), want, fmt)  # the same format: fine
    b = bits(fmt, (3, 1, 5, 4), 9)
    torch.save(torch.from_numpy(b.view(signed).copy()).view(itype).view(tdt), tmp_path / "stacked.pt")
    assert_bits(load_qkv(str(tmp_path / "stacked.pt"), None, None, None), (b[0], b[1], b[2]), fmt)


def test_pt_fp8_value_kept(tmp_path):
    """The reported case: 0.3125 in a float8_e4m3fn .pt file stays 0.3125 (its code, 0x2a, stays 0x2a)."""
    torch = pytest.importorskip("torch")
    q = torch.full((2, 4), 0.3125).to(torch.float8_e4m3fn)
    torch.save({"q": q, "k": q, "v": q}, tmp_path / "fp8.pt")
    got, _, _ = load_qkv(str(tmp_path / "fp8.pt"), None, None, None)
    assert got.dtype == ml_dtypes.float8_e4m3fn
    assert (got.view(np.uint8) == 0x2A).all() and (got.astype(np.float64) == 0.3125).all()


# ---- round trips, --q/--k/--v -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(DTYPES))
def test_separate_npy_round_trip(tmp_path, fmt):
    want = qkv_bits(fmt)
    for n, b in zip("qkv", want, strict=True):
        np.save(tmp_path / f"{n}.npy", typed(b, fmt))
    files = [str(tmp_path / f"{n}.npy") for n in "qkv"]
    assert_bits(load_qkv(None, *files, fmt), want, fmt)
    if fmt not in (*NUMPY_TYPED, "bf16"):
        with pytest.raises(InputError) as exc:
            load_qkv(None, *files)
        one_line_error(exc, "--q", "--input-format")


@pytest.mark.parametrize("torch_name", TORCH_DTYPES)
def test_separate_pt_round_trip(tmp_path, torch_name):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, torch_name):
        pytest.skip(f"this torch has no {torch_name}")
    fmt = TORCH_FORMAT[torch_name]
    want = qkv_bits(fmt)
    itype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[DTYPES[fmt].itemsize]
    signed = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[DTYPES[fmt].itemsize]
    for n, b in zip("qkv", want, strict=True):
        t = torch.from_numpy(b.view(signed).copy()).view(itype).view(getattr(torch, torch_name))
        torch.save(t, tmp_path / f"{n}.pt")
    files = [str(tmp_path / f"{n}.pt") for n in "qkv"]
    assert_bits(load_qkv(None, *files), want, fmt)


@pytest.mark.parametrize("fmt", list(DTYPES))
def test_typed_in_memory(fmt):
    """numpy/ml_dtypes arrays as the API hands them over: typed, every format, kept as they are."""
    b = bits(fmt, (5, 7), 5)
    got = as_float(typed(b, fmt), "--data", "q")
    assert got.dtype == DTYPES[fmt]
    np.testing.assert_array_equal(got.view(b.dtype), b)
    np.testing.assert_array_equal(as_float(typed(b, fmt), "--data", "q", DTYPES[fmt]).view(b.dtype), b)


# ---- refusals -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "other"), [("e4m3fn", "e5m2"), ("e5m2", "e4m3fn"), ("bf16", "fp16"), ("fp32", "e5m2")])
def test_typed_array_refuses_other_input_format(tmp_path, fmt, other):
    with pytest.raises(InputError) as exc:
        as_float(typed(bits(fmt, (2, 2), 0), fmt), "--data", "q", DTYPES[other])
    one_line_error(exc, "--input-format", fmt, other, "--data")


def test_pt_refuses_other_input_format(tmp_path):
    torch = pytest.importorskip("torch")
    q = torch.full((2, 4), 0.3125).to(torch.float8_e4m3fn)
    torch.save({"q": q, "k": q, "v": q}, tmp_path / "fp8.pt")
    torch.save(q, tmp_path / "q.pt")
    with pytest.raises(InputError) as exc:
        load_qkv(str(tmp_path / "fp8.pt"), None, None, None, "e5m2")
    one_line_error(exc, "--input-format", "e4m3fn", "e5m2", "--data")
    with pytest.raises(InputError) as exc:
        load_qkv(None, *[str(tmp_path / "q.pt")] * 3, "e5m2")
    one_line_error(exc, "--input-format", "e4m3fn", "e5m2", "--q")


def test_npz_typed_float32_refuses_input_format(tmp_path):
    a = np.ones((2, 3), np.float32)
    np.savez(tmp_path / "d.npz", q=a, k=a, v=a)
    with pytest.raises(InputError) as exc:
        load_qkv(str(tmp_path / "d.npz"), None, None, None, "e5m2")
    one_line_error(exc, "--input-format", "fp32", "e5m2")


def test_raw_width_differs_from_input_format(tmp_path):
    np.save(tmp_path / "d.npy", typed(bits("bf16", (3, 2, 2), 0), "bf16"))
    with pytest.raises(InputError) as exc:
        load_qkv(str(tmp_path / "d.npy"), None, None, None, "e4m3fn")
    one_line_error(exc, "--input-format", "2-byte", "e4m3fn")


@pytest.mark.parametrize(
    "dtype",
    [ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float8_e4m3, ml_dtypes.float8_e8m0fnu, ml_dtypes.bcomplex32],
)
def test_ml_dtypes_without_format_refused(dtype):
    """ml_dtypes types emufloat has no format for (integers, other float8s, complex) are refused, never taken
    for raw bytes, with or without --input-format."""
    x = np.zeros((2, 2), dtype)
    for raw in (None, np.dtype(ml_dtypes.float8_e4m3fn)):
        with pytest.raises(InputError) as exc:
            as_float(x, "--k", "k", raw)
        one_line_error(exc, "--k", np.dtype(dtype).name)


def test_torch_without_format_refused(tmp_path):
    torch = pytest.importorskip("torch")
    for name in ("float8_e8m0fnu", "float4_e2m1fn_x2"):
        if not hasattr(torch, name):
            continue
        t = torch.zeros((2, 2), dtype=torch.uint8).view(getattr(torch, name))
        torch.save(t, tmp_path / "q.pt")
        with pytest.raises(InputError) as exc:
            load_one(str(tmp_path / "q.pt"), "--q", "q")
        one_line_error(exc, "--q", name)


def test_npy_header_is_never_run(tmp_path):
    """A header holding code instead of literals is refused without running it; so is a pickled array."""
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    header = ("{'descr': '<f1', 'fortran_order': False, 'shape': (" + code + ",), }").encode("latin1")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    (tmp_path / "evil.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\0" * 8)
    np.save(tmp_path / "obj.npy", np.array([Path(str(marker))], dtype=object), allow_pickle=True)
    for name in ("evil.npy", "obj.npy"):
        with pytest.raises(InputError) as exc:
            load_one(str(tmp_path / name), "--q", "q", DTYPES["e5m2"])
        one_line_error(exc, "--q", "numpy.save")
    assert not marker.exists()


def test_truncated_f1_npy_refused(tmp_path):
    np.save(tmp_path / "d.npy", typed(bits("e5m2", (3, 4, 4), 0), "e5m2"))
    data = (tmp_path / "d.npy").read_bytes()
    (tmp_path / "d.npy").write_bytes(data[:-5])
    with pytest.raises(InputError) as exc:
        load_qkv(str(tmp_path / "d.npy"), None, None, None, "e5m2")
    one_line_error(exc, "--data", "numpy.save")


def test_read_npy_matches_numpy_on_numpy_files():
    """On a file numpy can read, read_npy is numpy's reader (a float32 Fortran array, a 0-d array)."""
    for a in (np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)), np.float64(2.5)):
        buf = io.BytesIO()
        np.save(buf, a)
        buf.seek(0)
        got = read_npy(buf)
        assert got.dtype == np.asarray(a).dtype
        np.testing.assert_array_equal(got, a)


# ---- the command itself -------------------------------------------------------------------------------
def test_cli_fp8_pt(tmp_path, capsys):
    """`flashsim trace-row` on a float8_e4m3fn .pt: refused with --input-format e5m2 (exit 2, one line)."""
    torch = pytest.importorskip("torch")
    from flashsim import cli

    g = torch.Generator().manual_seed(0)
    torch.save({n: torch.randn(4, 8, generator=g).to(torch.float8_e4m3fn) for n in "qkv"}, tmp_path / "fp8.pt")
    argv = ["trace-row", "--data", str(tmp_path / "fp8.pt"), "--no-plots", "--quiet", "--softmax", "standard"]
    argv += ["--out", str(tmp_path / "out"), "--input-format", "e5m2"]
    with pytest.raises(SystemExit) as exc:
        sys.exit(cli.main(argv))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2
    assert len(err.splitlines()) == 1 and "--input-format" in err and "e4m3fn" in err and "e5m2" in err, err
