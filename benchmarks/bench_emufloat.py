"""Throughput of emufloat's casts and arithmetic beside ml_dtypes, torch, CPFloat and the memory limit.

One run prints three tables.  The first has one row per operation: emufloat's ns/element, the memory limit
(a numpy copy moving the same bytes: reading and writing half the bytes the operation reads and writes, so the
same traffic) and the share of it emufloat reaches, and each peer's ns/element with its ratio (peer time /
emufloat time; above 1: emufloat is faster) and whether its bits agree with emufloat's.  Rows with goals say
which they meet; nothing is asserted.  The second times emufloat's variants (traced, other rounding modes)
against its own plain call; the third, the per-call cost at n = 1, 2**12 and 2**16.

    python -m benchmarks.bench_emufloat --cpfloat-src PATH   # n = 2**24, best of 9, every table
    python -m benchmarks.bench_emufloat --quick              # n = 2**18, a smoke run
    python -m benchmarks.bench_emufloat --small              # only the per-call table

Peers: ml_dtypes (numpy's casts and ufuncs on bfloat16/float8 arrays; numpy's own float16), torch's CPU kernels
when torch is installed (its default threads), and CPFloat (C, OpenMP, as many threads as Numba's), built from
source at start-up by benchmarks/_cpfloat.py (`--cpfloat-src PATH` or `CPFLOAT_SRC`: a checkout or a git
directory; otherwise a shallow clone), its columns left empty with one line saying why when that fails.  CPFloat
reads and writes float32 (narrow operands widened once, untimed), so its calls move more bytes.  Rows marked
"out=" write into a preallocated array on every side (and the memory limit copies into one); the others
allocate their output on every call, as most users' calls do.

Every callable runs once untimed first (Numba compilation or cache loading), then a parallel kernel runs for
`--spin-up` seconds, then each row's callables run `--repeat` times, interleaved (emufloat, the copy, each peer,
then again starting one further along), so a burst of other load skews no side alone and no callable always
follows the same other one; the table reports the best.  "other load" is the
CPU other processes used meanwhile (see OtherLoad).  Inputs are float32 draws of a standard normal (bf16 and
fp16 operands are those rounded): the range real activations occupy, so most elements take the kernels' fast
paths and a few (tiny values, E4M3/E5M2 subnormals) the general one.
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
from dataclasses import dataclass, field
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


def measure(fns: list[Callable[[], object]], repeat: int, rotate: bool = False) -> list[Timing]:
    """Best and median wall time of each callable, repetitions interleaved.

    Interleaving (a, b, a, b, ...) exposes both sides of a ratio to the same
    machine state, so a burst of other load skews neither alone.  ``rotate``:
    repetition r starts at callable r (modulo their number), so no callable always
    runs right after the same other one: a call right after another runtime's
    parallel region (torch's or CPFloat's OpenMP threads, still spinning) runs
    slower (history/tried.md).
    """
    for fn in fns:
        fn()  # warm-up: compile / load the Numba cache, fault in allocator pages
    times: list[list[float]] = [[] for _ in fns]
    k = len(fns)
    for r in range(repeat):
        for j in range(k):
            i = (j + r) % k if rotate else j
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
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


@dataclass
class Peer:
    """One peer's call of a row's operation, and how to tell whether its bits equal emufloat's."""

    label: str
    fn: Callable[[], object]
    check: Callable[[object, object], str] | None = None  # (emufloat's result, the peer's) -> "yes" / "no: ..."


@dataclass
class Op:
    """A row of the main table: emufloat's call, the bytes it reads and writes an element, its peers."""

    name: str
    fn: Callable[[], object]
    nbytes: float  # bytes read and written per element
    out: bool = False  # writes into a preallocated array
    peers: dict[str, Peer] = field(default_factory=dict)  # column -> peer
    goals: tuple[str, ...] = ()  # "limit" (>= 80% of the memory limit), or a peer column (>= 1x)


PEERS = ("ml_dtypes", "torch", "CPFloat")
LIMIT_GOAL = 0.8


def _bits_of(x: object) -> np.ndarray:
    """Encodings as unsigned integers, whatever the array's (or torch tensor's) dtype."""
    if not isinstance(x, np.ndarray):  # a torch tensor: its bits through a signed integer view
        import torch

        x = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]).numpy()
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def same_bits_any(x: object, y: object) -> str:
    """Whether two results of one format hold the same encodings (ml_dtypes / numpy / torch carriers)."""
    a, b = _bits_of(x), _bits_of(y)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"no ({a.dtype} vs {b.dtype})"
    k = int(np.count_nonzero(a != b))
    return "yes" if k == 0 else f"no: {k} differ"


def make_ops(n: int, seed: int, cpf: _cpfloat.CPFloat | None, torch_mod: object | None) -> list[Op]:
    """The main table's rows on standard normal inputs of n elements."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    c32 = rng.standard_normal(n, dtype=np.float32)
    bf, f16 = ml_dtypes.bfloat16, np.float16
    narrow = {"bf16": (x.astype(bf), y.astype(bf)), "fp16": (x.astype(f16), y.astype(f16))}
    dtypes = {"bf16": bf, "fp16": f16, "e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    bufs = {k: np.empty(n, dt) for k, dt in dtypes.items()}
    f32_buf = np.empty(n, np.float32)
    cpf_targets = {"bf16": _cpfloat.BF16, "fp16": _cpfloat.FP16, "e4m3fn": _cpfloat.E4M3, "e5m2": _cpfloat.E5M2}
    torch = torch_mod
    tdt = {}
    if torch is not None:
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
        xt = torch.from_numpy(x)
        tbufs = {k: torch.empty(n, dtype=t) for k, t in tdt.items()}

    def cpf_check(emu, peer):
        return _cpfloat.same_values(emu, peer)

    ops: list[Op] = []
    for name, dt in dtypes.items():
        width = np.dtype(dt).itemsize
        base = "numpy" if name == "fp16" else "ml_dtypes"
        for out in (False, True):
            buf = bufs[name]
            peers: dict[str, Peer] = {}
            if out:
                emu = lambda name=name, buf=buf: ef.quantize(x, name, out=buf)  # noqa: E731
                peers["ml_dtypes"] = Peer(f"{base} np.copyto", lambda buf=buf: np.copyto(buf, x, casting="unsafe"))
            else:
                emu = lambda name=name: ef.quantize(x, name)  # noqa: E731
                peers["ml_dtypes"] = Peer(f"{base} astype", lambda dt=dt: x.astype(dt), same_bits_any)
            if torch is not None:
                td, tb = tdt[name], tbufs[name]
                if out:
                    peers["torch"] = Peer("copy_", lambda tb=tb: tb.copy_(xt))
                else:
                    peers["torch"] = Peer(".to", lambda td=td: xt.to(td), same_bits_any)
            if cpf is not None:
                t = cpf_targets[name]
                if out:
                    peers["CPFloat"] = Peer("cpfloatf", lambda t=t: cpf.round(x, t, out=f32_buf))
                else:
                    peers["CPFloat"] = Peer("cpfloatf", lambda t=t: cpf.round(x, t), cpf_check)
            label = f"cast f32->{name}" + (", out=" if out else "")
            ops.append(Op(label, emu, 4 + width, out, peers, ("limit", "torch", "CPFloat")))
    for fmt_name, (a, b) in narrow.items():
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        base = "numpy" if fmt_name == "fp16" else "ml_dtypes"
        if torch is not None:
            at, bt = (torch.from_numpy(v.view(np.int16)).view(tdt[fmt_name]) for v in (a, b))
            tb = tbufs[fmt_name]
        for opname, sym, efn, ufunc in (("add", "+", ef.add, np.add), ("mul", "*", ef.mul, np.multiply)):
            for out in (False, True):
                buf = bufs[fmt_name]
                peers = {}
                if out:
                    emu = lambda efn=efn, a=a, b=b, buf=buf: efn(a, b, out=buf)  # noqa: E731
                    peers["ml_dtypes"] = Peer(f"{base} out=", lambda u=ufunc, a=a, b=b, buf=buf: u(a, b, out=buf))
                else:
                    emu = lambda efn=efn, a=a, b=b: efn(a, b)  # noqa: E731
                    peers["ml_dtypes"] = Peer(f"{base} a {sym} b", lambda u=ufunc, a=a, b=b: u(a, b), same_bits_any)
                if torch is not None:
                    tfn = getattr(torch, opname)
                    if out:
                        peers["torch"] = Peer("out=", lambda f=tfn, at=at, bt=bt, tb=tb: f(at, bt, out=tb))
                    else:
                        peers["torch"] = Peer(f"a {sym} b", lambda f=tfn, at=at, bt=bt: f(at, bt), same_bits_any)
                if cpf is not None:
                    cfn, t, what = getattr(cpf, opname), cpf_targets[fmt_name], f"cpf_{opname}f"
                    if out:
                        peers["CPFloat"] = Peer(what, lambda f=cfn, p=a32, q=b32, t=t: f(p, q, t, out=f32_buf))
                    else:
                        peers["CPFloat"] = Peer(what, lambda f=cfn, p=a32, q=b32, t=t: f(p, q, t), cpf_check)
                label = f"{opname} {fmt_name}" + (", out=" if out else "")
                ops.append(Op(label, emu, 6, out, peers, ("limit", "torch", "CPFloat")))
    a, b = narrow["bf16"]
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    if torch is not None:
        at, bt = (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) for v in (a, b))
        ct, tbuf32 = torch.from_numpy(c32), torch.from_numpy(f32_buf)
    for out in (False, True):
        # bf16 * bf16 is exact in float32 (for these inputs), so numpy and torch round once, as ef.fma
        if out:
            emu = lambda: ef.fma(a, b, c32, fmt="fp32", out=f32_buf)  # noqa: E731
            wide = lambda: np.add(np.multiply(a.astype(np.float32), b.astype(np.float32)), c32, out=f32_buf)  # noqa: E731
            peers = {"ml_dtypes": Peer("numpy f32 a*b + c, out=", wide)}
        else:
            emu = lambda: ef.fma(a, b, c32, fmt="fp32")  # noqa: E731
            wide = lambda: a.astype(np.float32) * b.astype(np.float32) + c32  # noqa: E731
            peers = {"ml_dtypes": Peer("numpy f32 a*b + c", wide, same_bits_any)}
        if torch is not None:
            if out:
                tfn = lambda: torch.addcmul(ct, at.float(), bt.float(), out=tbuf32)  # noqa: E731
                peers["torch"] = Peer("addcmul out=", tfn)
            else:
                peers["torch"] = Peer("addcmul", lambda: torch.addcmul(ct, at.float(), bt.float()), same_bits_any)
        if cpf is not None:
            if out:
                cfn = lambda: cpf.fma(a32, b32, c32, _cpfloat.FP32, out=f32_buf)  # noqa: E731
                peers["CPFloat"] = Peer("cpf_fmaf, out=", cfn)
            else:
                cfn = lambda: cpf.fma(a32, b32, c32, _cpfloat.FP32)  # noqa: E731
                peers["CPFloat"] = Peer("cpf_fmaf", cfn, same_bits_any)
        label = "fma bf16*bf16+f32 -> f32" + (", out=" if out else "")
        ops.append(Op(label, emu, 12, out, peers, ("CPFloat",)))
    b_nz = np.where(b == 0, bf(1), b)  # division by zero is its own (slow) path in any implementation
    a_pos = np.abs(a)
    div_peers = {"ml_dtypes": Peer("ml_dtypes a / b", lambda: a / b_nz, same_bits_any)}
    sqrt_peers = {"ml_dtypes": Peer("ml_dtypes np.sqrt", lambda: np.sqrt(a_pos), same_bits_any)}
    if torch is not None:
        nt, dt, st = (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) for v in (a, b_nz, a_pos))
        div_peers["torch"] = Peer("a / b", lambda: torch.div(nt, dt), same_bits_any)
        sqrt_peers["torch"] = Peer("sqrt", lambda: torch.sqrt(st), same_bits_any)
    ops.append(Op("div bf16", lambda: ef.div(a, b_nz), 6, False, div_peers))
    ops.append(Op("sqrt bf16", lambda: ef.sqrt(a_pos), 4, False, sqrt_peers))
    return ops


def make_variants(n: int, seed: int) -> list[Row]:
    """emufloat's variants of one call against its plain call: the cost of a trace or a rounding mode."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    a = x.astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(n, dtype=np.float32).astype(ml_dtypes.bfloat16)
    sr = ef.stochastic(bits=8, seed=1)

    def cast(mode):
        return lambda: ef.quantize(x, "bf16", mode)

    def traced_then_read():
        tr = ef.Trace()
        ef.add(a, b, trace=tr)
        return tr.chunks[0].flags

    return [
        Row(
            "add bf16, traced",
            lambda: ef.add(a, b, trace=ef.Trace()),
            "emufloat add bf16 untraced",
            lambda: ef.add(a, b),
            0.5,
            "fresh Trace per repetition",
        ),
        Row(
            "add bf16, traced, then its flags read",
            traced_then_read,
            "emufloat add bf16 untraced",
            lambda: ef.add(a, b),
            None,
            "the trace's columns derived",
        ),
        Row("cast f32->bf16 rtz", cast("rtz"), "emufloat bf16 rne cast", cast("rne")),
        Row("cast f32->bf16 rup", cast("rup"), "emufloat bf16 rne cast", cast("rne")),
        Row("cast f32->bf16 stochastic(8 bits)", cast(sr), "emufloat bf16 rne cast", cast("rne")),
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


def add_common_args(p: argparse.ArgumentParser, quick_help: str, repeat: int = 5) -> None:
    """The options every emufloat benchmark script takes (``repeat``: the default of ``--repeat``)."""
    p.add_argument("--repeat", type=int, default=repeat, help=f"timed repetitions per callable (default {repeat})")
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


def measure_limit(nbytes: float, n: int, out: bool, cache: dict) -> Callable[[], object]:
    """A numpy copy moving ``nbytes`` an element over n elements (reading and writing half each): allocating
    its output, or (``out``) into a preallocated array."""
    size = int(nbytes * n) // 2
    if (size, out) not in cache:
        src = np.ones(size, np.uint8)
        dst = np.empty(size, np.uint8)
        dst.fill(0)
        cache[size, out] = (lambda: np.copyto(dst, src)) if out else src.copy
    return cache[size, out]


def op_table(ops: list[Op], n: int, repeat: int) -> None:
    """The main table: each op beside the memory limit and its peers, timed interleaved."""
    cols = [c for c in PEERS if any(c in op.peers for op in ops)]
    head = "| op | emufloat ns/elt | memory limit ns/elt | % of limit |"
    head += "".join(f" {c} | {c} ratio |" for c in cols) + " same bits | goals | other load |"
    print(head)
    print("|---|---:|---:|---:|" + "---|---:|" * len(cols) + "---|---|---:|")
    copies: dict = {}
    for op in ops:
        limit = measure_limit(op.nbytes, n, op.out, copies)
        peers = [op.peers[c] for c in cols if c in op.peers]
        with OtherLoad() as other:
            timings = measure([op.fn, limit, *(p.fn for p in peers)], repeat, rotate=True)
        t, tl = timings[0].best, timings[1].best
        share = tl / t
        cells, ratios = [], {"limit": share}
        peer_t = dict(zip((c for c in cols if c in op.peers), timings[2:], strict=True))
        for c in cols:
            if c in peer_t:
                r = peer_t[c].best / t
                ratios[c] = r
                cells.append(f" {op.peers[c].label}: {fmt_ns(peer_t[c].best, n)} | {r:.2f}x |")
            else:
                cells.append(" | |")
        agree = []
        if any(p.check is not None for p in peers):
            mine = op.fn()
            for c in cols:
                p = op.peers.get(c)
                if p is not None and p.check is not None:
                    agree.append(f"{c} {p.check(mine, p.fn())}")
        goals = []
        for g in op.goals:
            want = LIMIT_GOAL if g == "limit" else 1.0
            if g in ratios:
                goals.append(("met" if ratios[g] >= want else "NOT met") + f" {g} >= {want:g}")
        load_s = "" if other.cores is None else f"{other.cores:.2f}"
        print(
            f"| {op.name} | {fmt_ns(t, n)} | {fmt_ns(tl, n)} | {share:.0%} |{''.join(cells)} {'; '.join(agree)} | "
            f"{'; '.join(goals)} | {load_s} |",
            flush=True,
        )


def variant_table(rows: list[Row], n: int, repeat: int) -> None:
    """emufloat's variants against its plain call."""
    print("| variant | ns/elt | plain call | plain ns/elt | ratio | goal | other load |")
    print("|---|---:|---|---:|---:|---|---:|")
    for row in rows:
        with OtherLoad() as other:
            t, tb = measure([row.fn, row.baseline], repeat, rotate=True)
        ratio = tb.best / t.best
        goal = "" if row.goal is None else f">= {row.goal:g}x: {'met' if ratio >= row.goal else 'NOT met'}"
        name = row.name + (f" ({row.note})" if row.note else "")
        load_s = "" if other.cores is None else f"{other.cores:.2f}"
        print(
            f"| {name} | {fmt_ns(t.best, n)} | {row.baseline_name} | {fmt_ns(tb.best, n)} | {ratio:.3f}x | {goal} "
            f"| {load_s} |",
            flush=True,
        )


def load_torch() -> object | None:
    """torch, or None (with a header line) when it is not installed."""
    try:
        import torch
    except ImportError:
        print("# torch is not installed: no torch columns")
        return None
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads (its default)")
    return torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_emufloat", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 24, help="elements per array (default 2**24)")
    add_common_args(p, "small run: n = 2**18, 3 repeats", repeat=9)
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
    torch = load_torch()
    cpf = load_cpfloat(args.cpfloat_src, numba.get_num_threads())
    ops = [o for o in make_ops(n, args.seed, cpf, torch) if args.only in o.name]
    variants = [r for r in make_variants(n, args.seed) if args.only in r.name]
    if not ops and not variants:
        p.error(f"--only {args.only!r} matches no row")
    for fn in [o.fn for o in ops] + [r.fn for r in variants]:  # compile or load every kernel first
        fn()
    copy = measure_limit(8, n, False, {})
    with OtherLoad() as other:
        (tc,) = measure([copy], args.repeat)
    print(
        f"# memory limit: a numpy copy of n float32 (8 bytes an element moved) takes {fmt_ns(tc.best, n)} ns an "
        f"element, {8 * n / tc.best / 1e9:.1f} GB/s (other load {other.cores or 0:.2f})"
    )
    # On a small VM the first second or so of parallel work runs slower (idle vCPUs waking, page
    # mappings settling); without this, whichever row comes first reads several times slow
    # (benchmarks/README.md, --spin-up).
    first = (ops or variants)[0].fn
    t_end = time.perf_counter() + args.spin_up
    while time.perf_counter() < t_end:
        first()
    print(
        f"# n = {n} elements, best of {args.repeat} interleaved after one warm-up call each and {args.spin_up:g} s "
        "of spin-up; ratio = peer time / emufloat time, above 1 = emufloat faster; % of limit = memory limit time / "
        "emufloat time; other load = cores busy with other processes during the row"
    )
    print()
    if ops:
        op_table(ops, n, args.repeat)
        print()
    if variants:
        variant_table(variants, n, args.repeat)
        print()
    if not args.only:
        print(f"# per-call cost, best of {args.repeat} batches")
        small_table(args.repeat, args.seed)
    print_footer()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
