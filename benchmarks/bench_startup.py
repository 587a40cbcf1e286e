"""How long the first use takes: the README's main job and a first `emufloat.quantize`, cold and warm.

    python -m benchmarks.bench_startup [--repeat 1] [--compile-detail]

Each measurement is a fresh Python process.  Cold: Numba's cache and emufloat's table cache in empty folders
(`NUMBA_CACHE_DIR`, `EMUFLOAT_CACHE_DIR`), so every kernel the command uses is compiled and every table
rebuilt; warm: the same command again on the caches the cold run filled.  Python's bytecode cache is as
Python keeps it by default (written on first import even where `PYTHONDONTWRITEBYTECODE` is set: an
installed package has it), so that no run compiles the project's modules from source.
The baseline is `python -c "import numba"` in the same way (what any Numba program pays before its first
kernel).  Prints one table: wall seconds (best of `--repeat`) and the ratio to the baseline;
`--compile-detail` adds the cold main job's compile seconds per Numba kernel.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "import numba (baseline)": [sys.executable, "-c", "import numba"],
    "first ef.quantize": [
        sys.executable,
        "-c",
        "import numpy as np, emufloat as ef; ef.quantize(np.linspace(-3, 3, 1000, dtype=np.float32), 'bf16')",
    ],
    "README main job (flashsim trace-row)": [sys.executable, "-m", "flashsim", "trace-row", "--quiet"],
}


# the main job in-process, with the seconds Numba spends compiling each kernel (outermost compiles only)
COMPILE_DETAIL = """
import collections, runpy, sys, time
from numba.core import dispatcher
spent, depth, real = collections.Counter(), [0], dispatcher.Dispatcher.compile
def compile(self, sig):
    depth[0] += 1
    t0 = time.perf_counter()
    try:
        return real(self, sig)
    finally:
        depth[0] -= 1
        if depth[0] == 0:
            spent[self.py_func.__module__ + "." + self.py_func.__qualname__] += time.perf_counter() - t0
dispatcher.Dispatcher.compile = compile
sys.argv = ["flashsim", "trace-row", "--quiet", "--out", sys.argv[1]]
try:
    runpy.run_module("flashsim", run_name="__main__")
except SystemExit:
    pass
for name, sec in spent.most_common():
    print(f"| {name} | {sec:.1f} |")
"""


def compile_detail() -> None:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [sys.executable, "-c", COMPILE_DETAIL, out], env=environment(cache), capture_output=True, text=True
        )
    if proc.returncode:
        raise SystemExit(f"the main job failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    print()
    print("| kernel (cold main job) | compile s |")
    print("|---|---:|")
    print(proc.stdout, end="")


def environment(cache: str) -> dict[str, str]:
    """The measured processes' environment: the caches in ``cache``, Python's bytecode cache written."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, EMUFLOAT_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(cmd: list[str], cache: str, out: str) -> float:
    env = environment(cache)
    full = [*cmd, "--out", out] if "trace-row" in cmd else cmd
    t0 = time.perf_counter()
    proc = subprocess.run(full, env=env, cwd=out, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(full)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_startup", description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="cold and warm runs per command (best is kept)")
    ap.add_argument("--compile-detail", action="store_true", help="also the cold main job's compile time per kernel")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat: expected a positive count, got {args.repeat}")
    rows = []
    for name, cmd in COMMANDS.items():
        cold, warm = [], []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
                cold.append(timed(cmd, cache, out))
                warm.append(timed(cmd, cache, out))
        rows.append((name, min(cold), min(warm)))
        print(f"{name}: cold {min(cold):.1f} s, warm {min(warm):.1f} s", file=sys.stderr, flush=True)
    base_cold, base_warm = rows[0][1], rows[0][2]
    print(f"| command ({os.cpu_count()} cores) | cold s | warm s | cold / baseline | warm / baseline |")
    print("|---|---:|---:|---:|---:|")
    for name, c, w in rows:
        print(f"| {name} | {c:.1f} | {w:.2f} | {c / base_cold:.1f}x | {w / base_warm:.1f}x |")
    if args.compile_detail:
        compile_detail()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
