"""CPFloat (Fasi & Mikaitis; C, OpenMP) as a benchmark baseline, built from source at run time.

Nothing of CPFloat is vendored.  `load` finds its source (a checkout or a bare/mirror git directory
named by `--cpfloat-src` or `CPFLOAT_SRC`, else a shallow clone of the upstream repository into a
temporary directory), compiles a small C shim around the header-only `cpfloat_binary32.h` with
`gcc -O3 -march=native -fopenmp` and returns a `CPFloat` that calls it through ctypes on numpy
float32 arrays.  Anything missing (git, network, a C compiler) raises `Unavailable` with one line
saying what and how to supply it.

CPFloat rounds float32 values to a target format and stores the results as float32 values; its arithmetic
computes in float32 and rounds the float32 result.  Without the optional pcg-c library CPFloat falls back
to its own generator, which only its stochastic modes use; the round-to-nearest-even paths used here do not.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

UPSTREAM = "https://github.com/north-numerical-computing/cpfloat"
HEADER = "src/cpfloat_binary32.h"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=gnu99", "-shared", "-fPIC")

SHIM = r"""
#include <omp.h>
#include "cpfloat_binary32.h"

/* One optstruct per target format, built once: round to nearest, ties to even (or, without `round`, no
   rounding: the float32 result as computed), no bit flips. */
void *shim_options(int precision, int emin, int emax, int subnormals, int infinity, int saturation, int round) {
  optstruct *o = init_optstruct();
  if (o == NULL) return NULL;
  strcpy(o->format, "custom");
  o->precision = precision;
  o->emin = emin;
  o->emax = emax;
  o->explim = CPFLOAT_EXPRANGE_TARG;
  o->subnormal = subnormals ? CPFLOAT_SUBN_USE : CPFLOAT_SUBN_RND;
  o->infinity = infinity ? CPFLOAT_INF_USE : CPFLOAT_INF_NO;
  o->saturation = saturation ? CPFLOAT_SAT_USE : CPFLOAT_SAT_NO;
  o->round = round ? CPFLOAT_RND_NE : CPFLOAT_NO_RND;
  o->flip = CPFLOAT_SOFTERR_NO;
  o->p = 0.0;
  return o;
}
int shim_validate(void *o) { return cpfloat_validate_optstructf((optstruct *)o); }
int shim_round(void *o, float *x, const float *a, size_t n) { return cpfloatf(x, a, n, (optstruct *)o); }
int shim_add(void *o, float *x, const float *a, const float *b, size_t n) {
  return cpf_addf(x, a, b, n, (optstruct *)o);
}
int shim_mul(void *o, float *x, const float *a, const float *b, size_t n) {
  return cpf_mulf(x, a, b, n, (optstruct *)o);
}
int shim_fma(void *o, float *x, const float *a, const float *b, const float *c, size_t n) {
  return cpf_fmaf(x, a, b, c, n, (optstruct *)o);
}
void shim_set_threads(int n) { omp_set_num_threads(n); }
int shim_max_threads(void) { return omp_get_max_threads(); }
"""


class Unavailable(RuntimeError):
    """CPFloat cannot be used here; the message says why and how to supply what is missing."""


@dataclass(frozen=True)
class Target:
    """The optstruct fields CPFloat rounds with (its names; precision counts the implicit bit)."""

    name: str
    precision: int
    emin: int
    emax: int
    subnormals: bool
    infinity: bool  # False: overflow and infinite inputs give NaN
    saturation: bool = False
    rounds: bool = True  # False: CPFLOAT_NO_RND, the float32 result as computed


# bfloat16 with subnormals, as ml_dtypes and emufloat have them (CPFloat's own "bf16" preset rounds
# subnormals away).
BF16 = Target("bf16", 8, -126, 127, subnormals=True, infinity=True)
FP16 = Target("fp16", 11, -14, 15, subnormals=True, infinity=True)
E5M2 = Target("e5m2", 3, -14, 15, subnormals=True, infinity=True)
# fmaf's result as it is.  Rounding to precision 24 is not the identity in CPFloat: its round-to-nearest adds the
# last kept bit (ties to even) even when no bit is cut, so every odd float32 encoding moves up by one.
FP32 = Target("fp32", 24, -126, 127, subnormals=True, infinity=True, rounds=False)
# CPFloat's own E4M3 preset ("e4m3", "q43"): the exponent range of OCP's e4m3fn but no reserved NaN
# pattern, so 480 is its largest value (e4m3fn: 448) and values at or above 496 become NaN.
E4M3 = Target("e4m3", 4, -6, 8, subnormals=True, infinity=False)


@dataclass(frozen=True)
class Source:
    """A directory holding CPFloat's `src/` and a line saying where it came from."""

    root: Path
    origin: str


def _run(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(cmd, capture_output=True, timeout=timeout, cwd=cwd, env=env, check=False)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout or b"").decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _commit(git_args: list[str]) -> str:
    proc = _run(["git", *git_args, "rev-parse", "--short=12", "HEAD"], timeout=30)
    return proc.stdout.decode().strip() if proc.returncode == 0 else "commit unknown"


def _from_git_dir(git_dir: Path, workdir: Path) -> Source:
    """Extract `src/` of HEAD from a bare or mirror git directory (no work tree needed)."""
    proc = _run(["git", f"--git-dir={git_dir}", "archive", "--format=tar", "HEAD", "src"], timeout=120)
    if proc.returncode != 0:
        raise Unavailable(f"git archive of src/ at HEAD failed in {git_dir}: {_last_line(proc)}")
    root = workdir / "cpfloat"
    kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python < 3.10.12 lacks filters
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(root, **kwargs)
    return Source(root, f"{git_dir} at {_commit([f'--git-dir={git_dir}'])}")


SOURCE_KINDS = f"a CPFloat checkout (with {HEADER}) or a bare or mirror git directory of one"


def _is_checkout(path: Path) -> bool:
    return (path / HEADER).is_file()


def _is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def is_source(spec: str) -> bool:
    """Whether `spec` names a directory find_source can take (SOURCE_KINDS)."""
    path = Path(spec).expanduser()
    return _is_checkout(path) or _is_git_dir(path)


def find_source(spec: str | None, workdir: Path) -> Source:
    """CPFloat's source from `spec` (SOURCE_KINDS), else a shallow clone of UPSTREAM into `workdir`."""
    path = None if spec is None else Path(spec).expanduser()
    if path is not None and _is_checkout(path):
        return Source(path, f"{path} at {_commit(['-C', str(path)])}")
    if path is not None and not _is_git_dir(path):
        raise Unavailable(f"{spec} is not {SOURCE_KINDS}")
    if shutil.which("git") is None:
        raise Unavailable("git is not installed; pass a CPFloat checkout with --cpfloat-src PATH or CPFLOAT_SRC")
    if path is not None:
        return _from_git_dir(path, workdir)
    dest = workdir / "cpfloat"
    try:
        proc = _run(["git", "clone", "--quiet", "--depth", "1", UPSTREAM, str(dest)], timeout=180)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"git clone {UPSTREAM} took over 180 s; pass --cpfloat-src PATH or set CPFLOAT_SRC") from None
    if proc.returncode != 0:
        raise Unavailable(
            f"could not clone {UPSTREAM} ({_last_line(proc)}); pass --cpfloat-src PATH or set CPFLOAT_SRC"
        )
    return Source(dest, f"{UPSTREAM} at {_commit(['-C', str(dest)])}")


def build(source: Source, workdir: Path, compiler: str = "gcc") -> Path:
    """Compile the shim against `source` into `workdir`; the shared library's path."""
    cc = shutil.which(compiler)
    if cc is None:
        raise Unavailable(f"no C compiler: {compiler} not found on PATH")
    shim = workdir / "cpfloat_shim.c"
    shim.write_text(SHIM)
    lib = workdir / "libcpfloat_shim.so"
    cmd = [cc, *CFLAGS, "-I", str(source.root / "src"), str(shim), "-o", str(lib), "-lm"]
    proc = _run(cmd, timeout=300)
    if proc.returncode != 0:
        raise Unavailable(f"{compiler} could not build the CPFloat shim: {_last_line(proc)}")
    return lib


def _compiler_version(compiler: str) -> str:
    proc = _run([compiler, "--version"], timeout=30)
    return proc.stdout.decode().splitlines()[0] if proc.returncode == 0 and proc.stdout else compiler


_F32 = np.dtype(np.float32)


def _check(name: str, arr: np.ndarray) -> None:
    if arr.dtype != _F32 or not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be a C-contiguous float32 array, got {arr.dtype}")


class CPFloat:
    """CPFloat's binary32 rounding and arithmetic through the compiled shim (round to nearest even)."""

    def __init__(self, lib_path: Path, source: Source, compiler: str, keep: object = None):
        self._keep = keep  # the temporary directory holding the library lives as long as this object
        self.source = source
        self.compiler = _compiler_version(compiler)
        lib = ctypes.CDLL(str(lib_path))
        p, f = ctypes.c_void_p, ctypes.c_int
        lib.shim_options.restype = p
        lib.shim_options.argtypes = [f] * 7
        lib.shim_validate.argtypes = [p]
        lib.shim_round.argtypes = [p, p, p, ctypes.c_size_t]
        lib.shim_add.argtypes = lib.shim_mul.argtypes = [p, p, p, p, ctypes.c_size_t]
        lib.shim_fma.argtypes = [p, p, p, p, p, ctypes.c_size_t]
        lib.shim_set_threads.argtypes = [f]
        self._lib = lib
        self._opts: dict[Target, int] = {}

    def set_threads(self, n: int) -> None:
        """OpenMP threads for the following calls (omp_set_num_threads on this thread)."""
        if n < 1:
            raise ValueError(f"threads must be at least 1, got {n}")
        self._lib.shim_set_threads(n)

    @property
    def threads(self) -> int:
        return int(self._lib.shim_max_threads())

    def _options(self, target: Target) -> int:
        if target not in self._opts:
            t = target
            ptr = self._lib.shim_options(t.precision, t.emin, t.emax, t.subnormals, t.infinity, t.saturation, t.rounds)
            code = self._lib.shim_validate(ptr) if ptr else None
            if code is None or code > 0:  # negative codes are warnings (e.g. the format string)
                raise ValueError(f"CPFloat rejects target {target} (validation code {code})")
            self._opts[target] = ptr
        return self._opts[target]

    def _out(self, n: int, out: np.ndarray | None) -> np.ndarray:
        if out is None:
            return np.empty(n, np.float32)
        _check("out", out)
        if out.size != n:
            raise ValueError(f"out must have {n} elements, got {out.size}")
        return out

    def round(self, x: np.ndarray, target: Target, out: np.ndarray | None = None) -> np.ndarray:
        """x rounded to `target`, as float32 values (into `out` when given)."""
        _check("x", x)
        res = self._out(x.size, out)
        self._lib.shim_round(self._options(target), res.ctypes.data, x.ctypes.data, x.size)
        return res

    def _binary(self, fn, a: np.ndarray, b: np.ndarray, target: Target, out: np.ndarray | None) -> np.ndarray:
        _check("a", a)
        _check("b", b)
        if a.size != b.size:
            raise ValueError(f"a and b must have the same size, got {a.size} and {b.size}")
        res = self._out(a.size, out)
        fn(self._options(target), res.ctypes.data, a.ctypes.data, b.ctypes.data, a.size)
        return res

    def add(self, a: np.ndarray, b: np.ndarray, target: Target, out: np.ndarray | None = None) -> np.ndarray:
        """fl32(a + b) rounded to `target`."""
        return self._binary(self._lib.shim_add, a, b, target, out)

    def mul(self, a: np.ndarray, b: np.ndarray, target: Target, out: np.ndarray | None = None) -> np.ndarray:
        """fl32(a * b) rounded to `target`."""
        return self._binary(self._lib.shim_mul, a, b, target, out)

    def fma(
        self, a: np.ndarray, b: np.ndarray, c: np.ndarray, target: Target, out: np.ndarray | None = None
    ) -> np.ndarray:
        """fmaf(a, b, c) rounded to `target`."""
        for name, arr in (("a", a), ("b", b), ("c", c)):
            _check(name, arr)
        if not a.size == b.size == c.size:
            raise ValueError(f"a, b and c must have the same size, got {a.size}, {b.size} and {c.size}")
        res = self._out(a.size, out)
        self._lib.shim_fma(self._options(target), res.ctypes.data, a.ctypes.data, b.ctypes.data, c.ctypes.data, a.size)
        return res


def load(spec: str | None, compiler: str = "gcc") -> CPFloat:
    """Find CPFloat's source (`spec`: a checkout or git directory, None: clone), build the shim, load it."""
    tmp = tempfile.TemporaryDirectory(prefix="cpfloat-")
    workdir = Path(tmp.name)
    source = find_source(spec, workdir)
    return CPFloat(build(source, workdir, compiler), source, compiler, keep=tmp)


def same_values(narrow: np.ndarray, wide: np.ndarray) -> str:
    """Whether `narrow` (a low-precision array) widened to float32 equals CPFloat's float32 `wide`
    bit for bit; otherwise how many elements differ, and how many of those are NaN on both sides."""
    w = narrow.astype(np.float32)
    if w.shape != wide.shape:
        return f"no (shapes {w.shape} vs {wide.shape})"
    differ = w.view(np.uint32) != wide.view(np.uint32)
    k = int(np.count_nonzero(differ))
    if k == 0:
        return "yes"
    both_nan = int(np.count_nonzero(differ & np.isnan(w) & np.isnan(wide)))
    return f"no: {k} differ" + (f" ({both_nan} NaN on both sides)" if both_nan else "")
