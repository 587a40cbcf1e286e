"""Where emufloat and CPFloat give different bits: every float32 input of the casts, every bf16 operand pair.

    python -m benchmarks.cpfloat_bits --cpfloat-src PATH [--ops bf16,e4m3fn,add,mul]

The casts run over all 2**32 float32 bit patterns, add and mul over all 2**32 pairs of bfloat16 bit
patterns (CPFloat computes fl32(a op b) and rounds that to bf16).  emufloat's output is widened to float32
(exact) and compared bit for bit with CPFloat's float32 output.  Differing elements are sorted into: both
NaN (sign or payload differs), emufloat NaN where CPFloat gives a number, CPFloat NaN where emufloat gives a
number, and both numbers; for the last three, the first and last element of a kind in a chunk are printed
(up to 6 a kind) with their bit patterns, and for casts the range of finite |x| of that kind in the chunk.
Nothing is asserted: the counts are the result.  About 6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import emufloat as ef
from benchmarks import _cpfloat

CHUNK = 1 << 24
OPS = ("bf16", "e4m3fn", "add", "mul")


@dataclass
class Tally:
    """Differences between emufloat (widened to float32) and CPFloat, by kind, with examples."""

    total: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, emu: np.ndarray, cpf: np.ndarray, describe) -> None:
        """Count one chunk; `describe(i, mask, emu, cpf)` says which input element i came from (the first
        and last element of a kind in a chunk are described, up to 6 a kind)."""
        self.total += emu.size
        differ = emu.view(np.uint32) != cpf.view(np.uint32)
        if not differ.any():
            return
        en, cn = np.isnan(emu), np.isnan(cpf)
        for kind, mask in (
            ("both NaN", differ & en & cn),
            ("emufloat NaN, CPFloat number", differ & en & ~cn),
            ("CPFloat NaN, emufloat number", differ & cn & ~en),
            ("both numbers", differ & ~en & ~cn),
        ):
            k = int(np.count_nonzero(mask))
            if k:
                self.kinds[kind] = self.kinds.get(kind, 0) + k
                where = np.flatnonzero(mask)
                for i in sorted({int(where[0]), int(where[-1])}):
                    if kind != "both NaN" and len(self.examples.setdefault(kind, [])) < 6:
                        self.examples[kind].append(describe(i, mask, emu, cpf))

    def report(self, name: str, seconds: float) -> None:
        k = sum(self.kinds.values())
        print(f"{name}: {self.total} inputs, {k} differ ({seconds:.0f} s)")
        for kind, count in self.kinds.items():
            print(f"  {kind}: {count}")
            for example in self.examples.get(kind, []):
                print(f"    e.g. {example}")


def _show(v: np.float32) -> str:
    """A float32 value and its bit pattern."""
    return f"{float(v)!r} (0x{int(np.float32(v).view(np.uint32)):08x})"


def check_cast(cpf: _cpfloat.CPFloat, fmt: str, target: _cpfloat.Target) -> Tally:
    tally = Tally()
    for start in range(0, 1 << 32, CHUNK):
        x = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
        emu = ef.quantize(x, fmt).astype(np.float32)

        def describe(i, mask, emu, res, x=x):
            finite = np.abs(x[mask & np.isfinite(x)])
            span = f"|x| in [{finite.min():.9g}, {finite.max():.9g}]" if finite.size else "no finite x"
            return f"x = {_show(x[i])}: emufloat {_show(emu[i])}, CPFloat {_show(res[i])} ({span} in its chunk)"

        tally.add(emu, cpf.round(x, target), describe)
    return tally


def check_binary(cpf: _cpfloat.CPFloat, op: str) -> Tally:
    tally = Tally()
    rows = CHUNK >> 16
    b16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for start in range(0, 1 << 16, rows):
        a16 = np.repeat(np.arange(start, start + rows, dtype=np.uint32).astype(np.uint16), 1 << 16)
        bb = np.tile(b16, rows)
        a, b = a16.view(ml_dtypes.bfloat16), bb.view(ml_dtypes.bfloat16)
        emu = getattr(ef, op)(a, b).astype(np.float32)
        res = getattr(cpf, op)(a.astype(np.float32), b.astype(np.float32), _cpfloat.BF16)

        def describe(i, mask, emu, res, a=a, b=b):
            a32, b32 = np.float32(a[i]), np.float32(b[i])
            return f"a = {_show(a32)}, b = {_show(b32)}: emufloat {_show(emu[i])}, CPFloat {_show(res[i])}"

        tally.add(emu, res, describe)
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpfloat_bits", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpfloat-src", default=None, metavar="PATH", help=f"{_cpfloat.SOURCE_KINDS} (default: a clone)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    args = p.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        p.error(f"--ops: unknown {','.join(bad) or '(empty)'}; accepted: {','.join(OPS)}")
    if args.cpfloat_src is not None and not _cpfloat.is_source(args.cpfloat_src):
        p.error(f"--cpfloat-src {args.cpfloat_src!r} is not {_cpfloat.SOURCE_KINDS}")
    try:
        cpf = _cpfloat.load(args.cpfloat_src)
    except _cpfloat.Unavailable as e:
        print(f"CPFloat unavailable: {e}", file=sys.stderr)
        return 1
    print(f"# CPFloat: {cpf.source.origin}, {cpf.compiler}, {cpf.threads} OpenMP threads")
    for op in ops:
        t0 = time.perf_counter()
        if op == "bf16":
            tally = check_cast(cpf, "bf16", _cpfloat.BF16)
        elif op == "e4m3fn":
            tally = check_cast(cpf, "e4m3fn", _cpfloat.E4M3)
        else:
            tally = check_binary(cpf, op)
        tally.report(f"{op} (CPFloat {'E4M3' if op == 'e4m3fn' else 'bf16'})", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
