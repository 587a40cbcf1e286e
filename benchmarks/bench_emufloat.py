"""Throughput of emufloat's casts and arithmetic against native baselines.

Every row times an emufloat call and a named baseline on the same inputs in
the same process, and prints ns/element, millions of elements per second and
the ratio baseline_time / emufloat_time (above 1: emufloat is faster).  Rows
with a goal say whether the ratio meets it; nothing is asserted.  Where the
baseline should compute the same correctly rounded result, "same bits" says
whether the two agree bit for bit; "other load" is the CPU other processes
used meanwhile (see OtherLoad).

    python -m benchmarks.bench_emufloat            # n = 2**24, 5 repeats
    python -m benchmarks.bench_emufloat --quick    # n = 2**18, a smoke run
    python -m benchmarks.bench_emufloat --small    # per-call cost at n = 1, 2**12, 2**16

Baselines: ml_dtypes (numpy's casts and ufuncs on bfloat16/float8 arrays), numpy, torch's CPU kernels
when torch is installed (its default threads), and CPFloat (C, OpenMP, as many threads as Numba's), built
from source at start-up by benchmarks/_cpfloat.py (`--cpfloat-src PATH` or `CPFLOAT_SRC`: a checkout or
a git directory; otherwise a shallow clone), its rows skipped with one line saying why when that fails.
Rows marked "out=" write into a preallocated array on both sides (`ef.quantize(x, fmt, out=buf)` against
`np.copyto(buf, x, casting="unsafe")`); the others allocate their output on every call, as most users' calls do.

Every callable runs once untimed first (Numba compilation or cache loading),
then a parallel kernel runs for `--spin-up` seconds, then each row's
callables run `--repeat` times, interleaved with the baseline's
repetitions; the table reports the best and the median.  Outputs are
allocated by every call, as users' calls do, on both sides.  Inputs are
float32 draws of a standard normal (bf16 operands are those rounded to
bfloat16): the range real activations occupy, so most elements take the
kernels' fast paths and a few (tiny values, E4M3/E5M2 subnormals) the
general one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numba
import numpy as np

import emufloat as ef
from benchmarks import _cpfloat


@dataclass
class Timing:
    best: float
    median: float


def measure(fns: list[Callable[[], object]], repeat: int) -> list[Timing]:
    """Best and median wall time of each callable, repetitions interleaved.

    Interleaving (a, b, a, b, ...) exposes both sides of a ratio to the same
    machine state, so a burst of other load skews neither alone.
    """
    for fn in fns:
        fn()  # warm-up: compile / load the Numba cache, fault in allocator pages
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [Timing(min(ts), statistics.median(ts)) for ts in times]


@dataclass
class Row:
    name: str
    fn: Callable[[], object]
    baseline_name: str
    baseline: Callable[[], object] | None
    goal: float | None = None
    note: str = ""
    compare: bool = False  # the baseline computes the same correctly rounded result
    check: Callable[[], str] | None = None  # "same bits" where outputs are not directly comparable


def _busy_seconds() -> float | None:
    """CPU seconds all processes have been busy since boot (Linux /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Cores' worth of CPU used by other processes while a row ran.

    This machine may be shared: a competing process that holds one of two
    cores stalls every parallel kernel (Numba's threads wait for each other)
    while single-threaded numpy baselines barely notice, so rows measured
    under load understate emufloat.  Reported so such rows can be spotted.
    """

    def __enter__(self) -> OtherLoad:
        self.t0, self.busy0, self.own0 = time.perf_counter(), _busy_seconds(), sum(os.times()[:2])
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.t0
        busy1 = _busy_seconds()
        own = sum(os.times()[:2]) - self.own0
        self.cores = None if busy1 is None or self.busy0 is None else max(0.0, (busy1 - self.busy0 - own) / wall)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_rows(n: int, seed: int, cpf: _cpfloat.CPFloat | None = None) -> list[Row]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    bf = ml_dtypes.bfloat16
    a = x.astype(bf)
    b = rng.standard_normal(n, dtype=np.float32).astype(bf)
    c32 = rng.standard_normal(n, dtype=np.float32)
    y32 = rng.standard_normal(n, dtype=np.float32)
    a_pos = np.abs(a)
    b_nz = np.where(b == 0, bf(1), b)  # division by zero is its own (slow) path in any implementation

    def cast(fmt, mode="rne"):
        return lambda: ef.quantize(x, fmt, mode)

    def traced_add():
        return ef.add(a, b, trace=ef.Trace())

    def f32_fma():  # bf16 * bf16 is exact in float32 (for these inputs), so this rounds once, as ef.fma
        return a.astype(np.float32) * b.astype(np.float32) + c32

    sr = ef.stochastic(bits=8, seed=1)
    buf = np.empty(n, bf)
    rows = [
        Row(
            "cast f32->bf16 rne, out=",
            lambda: ef.quantize(x, "bf16", out=buf),
            "ml_dtypes np.copyto(bf16 buffer)",
            lambda: np.copyto(buf, x, casting="unsafe"),
            1.0,
        ),
        Row(
            "add bf16, out=",
            lambda: ef.add(a, b, out=buf),
            "ml_dtypes np.add(out=)",
            lambda: np.add(a, b, out=buf),
            1.0,
        ),
    ]
    rows += [] if cpf is None else cpfloat_rows(x, a, b, cpf)
    rows += [
        Row("cast f32->bf16 rne", cast("bf16"), "ml_dtypes astype(bfloat16)", lambda: x.astype(bf), 1.0, compare=True),
        Row(
            "cast f32->e4m3fn rne",
            cast("e4m3fn"),
            "ml_dtypes astype(float8_e4m3fn)",
            lambda: x.astype(ml_dtypes.float8_e4m3fn),
            5.0,
            compare=True,
        ),
        Row(
            "cast f32->e5m2 rne",
            cast("e5m2"),
            "ml_dtypes astype(float8_e5m2)",
            lambda: x.astype(ml_dtypes.float8_e5m2),
            compare=True,
        ),
        Row("cast f32->fp16 rne", cast("fp16"), "numpy astype(float16)", lambda: x.astype(np.float16), compare=True),
        Row("cast f32->bf16 rtz", cast("bf16", "rtz"), "emufloat bf16 rne cast", cast("bf16")),
        Row("cast f32->bf16 rup", cast("bf16", "rup"), "emufloat bf16 rne cast", cast("bf16")),
        Row("cast f32->bf16 stochastic(8 bits)", cast("bf16", sr), "emufloat bf16 rne cast", cast("bf16")),
        Row("add bf16", lambda: ef.add(a, b), "ml_dtypes a + b", lambda: a + b, 1.0, compare=True),
        Row(
            "add bf16, traced",
            traced_add,
            "emufloat add bf16 untraced",
            lambda: ef.add(a, b),
            0.25,
            "fresh Trace per repetition",
        ),
        Row("mul bf16", lambda: ef.mul(a, b), "ml_dtypes a * b", lambda: a * b, compare=True),
        Row(
            "fma bf16*bf16+f32 -> fp32",
            lambda: ef.fma(a, b, c32, fmt="fp32"),
            "numpy f32 a*b + c (with casts)",
            f32_fma,
            compare=True,
        ),
        Row("div bf16", lambda: ef.div(a, b_nz), "ml_dtypes a / b", lambda: a / b_nz, compare=True),
        Row("sqrt bf16", lambda: ef.sqrt(a_pos), "ml_dtypes np.sqrt(a)", lambda: np.sqrt(a_pos), compare=True),
        Row("numpy f32 add", lambda: x + y32, "numpy f32 copy", lambda: x.copy(), None, "memory-bound reference"),
        Row("numpy f32 copy", lambda: x.copy(), "", None, None, "memory-bound reference"),
    ]
    # torch last: after its kernels have run, every row measured later was up to 40% slower here
    return rows + torch_rows(x, a, b)


def torch_rows(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[Row]:
    """emufloat against torch's CPU kernels on the same values (none without torch)."""
    try:
        import torch
    except ImportError:
        print("# torch is not installed: no torch baselines", file=sys.stderr)
        return []
    xt = torch.from_numpy(x)
    at, bt = (torch.from_numpy(t.view(np.int16)).view(torch.bfloat16) for t in (a, b))
    threads = f"torch {torch.get_num_threads()} threads"
    return [
        Row(
            "cast f32->bf16 rne",
            lambda: ef.quantize(x, "bf16"),
            f"{threads}: .to(bfloat16)",
            lambda: xt.to(torch.bfloat16),
        ),
        Row("add bf16", lambda: ef.add(a, b), f"{threads}: a + b", lambda: at + bt),
        Row("mul bf16", lambda: ef.mul(a, b), f"{threads}: a * b", lambda: at * bt),
    ]


def cpfloat_rows(x: np.ndarray, a: np.ndarray, b: np.ndarray, cpf: _cpfloat.CPFloat) -> list[Row]:
    """emufloat against CPFloat on the same values, allocating and into preallocated arrays.

    CPFloat reads and writes float32 (the bf16 operands widened once, untimed), so "same bits" compares
    emufloat's output widened to float32 with CPFloat's.  Its E4M3 is not e4m3fn (largest value 480, no
    reserved NaN pattern): the two differ for 464 < |x| < 496 and for NaN inputs (benchmarks/cpfloat_bits.py).
    """
    n = x.size
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    bf_buf, f8_buf = np.empty(n, ml_dtypes.bfloat16), np.empty(n, ml_dtypes.float8_e4m3fn)
    f32_buf = np.empty(n, np.float32)
    name = f"CPFloat {cpf.threads} threads"
    bf16, e4m3 = _cpfloat.BF16, _cpfloat.E4M3

    def row(label, emu, emu_out, base, base_out, what):
        def check(emu=emu, base=base):
            return _cpfloat.same_values(emu(), base())

        return [
            Row(label, emu, f"{name}: {what}", base, check=check),
            Row(f"{label}, out=", emu_out, f"{name}: {what}, out=", base_out),
        ]

    return [
        *row(
            "cast f32->bf16 rne",
            lambda: ef.quantize(x, "bf16"),
            lambda: ef.quantize(x, "bf16", out=bf_buf),
            lambda: cpf.round(x, bf16),
            lambda: cpf.round(x, bf16, out=f32_buf),
            "cpfloatf bf16",
        ),
        *row(
            "cast f32->e4m3fn rne",
            lambda: ef.quantize(x, "e4m3fn"),
            lambda: ef.quantize(x, "e4m3fn", out=f8_buf),
            lambda: cpf.round(x, e4m3),
            lambda: cpf.round(x, e4m3, out=f32_buf),
            "cpfloatf E4M3",
        ),
        *row(
            "add bf16",
            lambda: ef.add(a, b),
            lambda: ef.add(a, b, out=bf_buf),
            lambda: cpf.add(a32, b32, bf16),
            lambda: cpf.add(a32, b32, bf16, out=f32_buf),
            "cpf_addf bf16",
        ),
        *row(
            "mul bf16",
            lambda: ef.mul(a, b),
            lambda: ef.mul(a, b, out=bf_buf),
            lambda: cpf.mul(a32, b32, bf16),
            lambda: cpf.mul(a32, b32, bf16, out=f32_buf),
            "cpf_mulf bf16",
        ),
    ]


def load_cpfloat(src: str | None, threads: int) -> _cpfloat.CPFloat | None:
    """CPFloat built from `src` (else CPFLOAT_SRC, else a clone), with `threads` OpenMP threads; a
    header line saying what was built, or why there are no CPFloat rows."""
    env = os.environ.get("CPFLOAT_SRC") or None
    spec = src if src is not None else env
    try:
        cpf = _cpfloat.load(spec)
    except _cpfloat.Unavailable as e:
        origin = "--cpfloat-src" if src is not None else "CPFLOAT_SRC" if env is not None else "no CPFloat source given"
        print(f"# CPFloat skipped ({origin}): {e}")
        return None
    cpf.set_threads(threads)
    print(
        f"# CPFloat: {cpf.source.origin}, built with {cpf.compiler} {' '.join(_cpfloat.CFLAGS)}, "
        f"OpenMP threads {cpf.threads} (= Numba's)"
    )
    return cpf


def small_table(repeat: int, seed: int) -> None:
    """Per-call cost (microseconds a call) where the fixed cost dominates: n = 1, 2**12, 2**16."""
    print("| call | n | emufloat us/call | ml_dtypes us/call | ratio |")
    print("|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(seed)
    for n in (1, 1 << 12, 1 << 16):
        x = rng.standard_normal(n, dtype=np.float32)
        a, b = x.astype(ml_dtypes.bfloat16), x[::-1].copy().astype(ml_dtypes.bfloat16)
        calls = max(1, 20000 // n) if n < 4096 else 200
        for name, fn, base in (
            ("quantize f32->bf16", lambda x=x: ef.quantize(x, "bf16"), lambda x=x: x.astype(ml_dtypes.bfloat16)),
            ("add bf16", lambda a=a, b=b: ef.add(a, b), lambda a=a, b=b: a + b),
        ):

            def batch(fn=fn, calls=calls):
                for _ in range(calls):
                    fn()

            def base_batch(base=base, calls=calls):
                for _ in range(calls):
                    base()

            t, tb = measure([batch, base_batch], repeat)
            us, ub = t.best / calls * 1e6, tb.best / calls * 1e6
            print(f"| {name} | {n} | {us:.1f} | {ub:.2f} | {ub / us:.3f}x |", flush=True)


def same_bits(x: np.ndarray, y: np.ndarray) -> str:
    """Whether two results agree bit for bit (count of differing elements otherwise)."""
    if x.dtype != y.dtype or x.shape != y.shape:
        return f"no ({x.dtype} vs {y.dtype})"
    u = np.dtype(f"u{x.dtype.itemsize}")
    k = int(np.count_nonzero(x.view(u) != y.view(u)))
    return "yes" if k == 0 else f"no: {k} differ"


def fmt_ns(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e9:.2f}"


def add_common_args(p: argparse.ArgumentParser, quick_help: str) -> None:
    """The options every emufloat benchmark script takes."""
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions per callable (default 5)")
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--threads", type=int, default=None, help="Numba threads (default: Numba's default)")
    p.add_argument("--only", default="", help="run only rows whose name contains this text")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--spin-up",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="run a parallel kernel this long before the first row (default 2)",
    )


def load_average() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def print_footer() -> None:
    """Threading layer and the load at the end (a busy machine explains slow rows)."""
    print()
    print(f"# numba threading layer: {numba.threading_layer()}; load average at the end: {load_average()}")


def print_header(title: str) -> None:
    """Date, command, versions, CPU and load: what a reader needs to compare two runs."""
    print(f"# {title}, {datetime.datetime.now().isoformat(timespec='seconds')}")
    spec = getattr(sys.modules["__main__"], "__spec__", None)  # python -m benchmarks.NAME: the module's name
    script = ["-m", spec.name] if spec is not None else sys.argv[:1]
    print(f"# command: {' '.join([Path(sys.executable).name, *script, *sys.argv[1:]])}")
    print(
        f"# python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}, "
        f"ml_dtypes {ml_dtypes.__version__}"
    )
    print(
        f"# cpu: {cpu_model()}, {os.cpu_count()} logical cores, numba threads {numba.get_num_threads()}, "
        f"load average {load_average()}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_emufloat", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 24, help="elements per array (default 2**24)")
    add_common_args(p, "small run: n = 2**18, 3 repeats")
    p.add_argument("--small", action="store_true", help="only the per-call table: n = 1, 2**12, 2**16")
    p.add_argument(
        "--cpfloat-src",
        default=None,
        metavar="PATH",
        help="CPFloat checkout or git directory for the CPFloat rows (default: $CPFLOAT_SRC, else a shallow clone)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.repeat = 1 << 18, 3
    if args.n < 1 or args.repeat < 1:
        p.error("--n and --repeat must be positive")
    if args.cpfloat_src is not None and not _cpfloat.is_source(args.cpfloat_src):
        p.error(f"--cpfloat-src {args.cpfloat_src!r} is not {_cpfloat.SOURCE_KINDS}")
    if args.threads is not None:
        numba.set_num_threads(args.threads)
    n = args.n

    print_header("emufloat benchmark")
    if args.small:
        print(f"# per-call cost, best of {args.repeat} batches")
        small_table(args.repeat, args.seed)
        print_footer()
        return 0
    cpf = load_cpfloat(args.cpfloat_src, numba.get_num_threads())
    print(
        f"# n = {n} elements, best and median of {args.repeat} after one warm-up call each and "
        f"{args.spin_up:g} s of spin-up; "
        "ratio = baseline time / emufloat time (best), above 1 = emufloat faster; "
        "other load = cores busy with other processes during the row"
    )
    print()
    print(
        "| row | ns/elt best | ns/elt median | M elt/s | baseline | baseline ns/elt | ratio | goal | same bits "
        "| other load |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---|---|---:|")
    rows = [r for r in make_rows(n, args.seed, cpf) if args.only in r.name or args.only in r.baseline_name]
    if not rows:
        p.error(f"--only {args.only!r} matches no row")
    for row in rows:  # compile or load every kernel first
        row.fn()
    # On a small VM the first second or so of parallel work runs slower (idle vCPUs waking, page
    # mappings settling); without this, whichever row comes first reads several times slow
    # (benchmarks/README.md, --spin-up).
    t_end = time.perf_counter() + args.spin_up
    while time.perf_counter() < t_end:
        rows[0].fn()
    for row in rows:
        with OtherLoad() as other:
            timings = measure([row.fn] if row.baseline is None else [row.fn, row.baseline], args.repeat)
        t = timings[0]
        if row.baseline is not None:
            tb = timings[1]
            ratio = tb.best / t.best
            base_ns, ratio_s = fmt_ns(tb.best, n), f"{ratio:.3f}x"
        else:
            ratio, base_ns, ratio_s = None, "", ""
        rate = n / t.best / 1e6
        if row.goal is None or ratio is None:
            goal = ""
        else:
            goal = f">= {row.goal:g}x: {'met' if ratio >= row.goal else 'not met'}"
        name = row.name + (f" ({row.note})" if row.note else "")
        load_s = "" if other.cores is None else f"{other.cores:.2f}"
        agree = same_bits(row.fn(), row.baseline()) if row.compare and row.baseline is not None else ""
        agree = row.check() if row.check is not None else agree
        print(
            f"| {name} | {fmt_ns(t.best, n)} | {fmt_ns(t.median, n)} | {rate:.0f} | {row.baseline_name} | "
            f"{base_ns} | {ratio_s} | {goal} | {agree} | {load_s} |",
            flush=True,
        )
    print_footer()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
