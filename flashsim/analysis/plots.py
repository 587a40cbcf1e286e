"""trace-row's PNG plots, drawn from plain data (`flashsim.analysis.report.plot_data()`): numpy and matplotlib
only, no relative import, so that a `Drawer` process loads this file alone (not flashsim and the emulator) and
draws on another core while the run computes.

- `draw()`: the plots, in this process;
- `Drawer`: a process started before the run, which imports matplotlib meanwhile and draws what `Drawer.send()`
  hands it; `Drawer.wait()` returns the files or raises what drawing raised.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import numpy as np

PLOT_FILES = ("cumulative_error.png", "block_error.png", "step_error.png")
EXIT_OSERROR = 3  # a Drawer process's status when writing a file failed (its stderr holds the reason)


def draw(data: dict, out_dir: Path | str, names: tuple[str, ...] = PLOT_FILES) -> list[Path]:
    """cumulative_error.png (O - O_fp64 summed along the row's elements), block_error.png (O so far after each
    K/V block) and step_error.png (mean signed rounding error and share rounded away per step), those of them
    in ``names``.  Needs matplotlib; raises ImportError without it."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state, a faster import

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    variants, where, banner = data["variants"], data["where"], data["banner"]
    paths = []

    def save(fig, name: str, bottom: float = 0.12, **space: float) -> None:
        """Lay out (fixed margins: measuring every label, as ``tight_layout`` does, takes longer than the
        drawing), add the non-finite banner, write ``out/name`` and close."""
        fig.subplots_adjust(left=0.12, right=0.98, top=0.92, bottom=bottom + (0.03 if banner else 0.0), **space)
        if banner:
            fig.text(0.01, 0.005, textwrap.shorten(banner, 160), color="red", fontsize=7, va="bottom")
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=110)

    if PLOT_FILES[0] in names:
        _cumulative(Figure(figsize=(8, 4.5)), variants, where, save)
    if PLOT_FILES[1] in names:
        _blocks(Figure(figsize=(8, 4.5)), variants, data["blocks"], where, save)
    if PLOT_FILES[2] in names:
        _steps(Figure(figsize=(9, 6.5)), variants, data["labels"], where, save)
    return paths


def _cumulative(fig, variants: list[dict], where: str, save) -> None:
    """O - O_fp64 summed along the row's elements, with its products part."""
    ax = fig.subplots()
    for a in variants:
        total = np.asarray(a["total"], np.float64)
        (line,) = ax.plot(np.cumsum(np.where(np.isfinite(total), total, 0.0)), label=f"{a['softmax']}: O - O_fp64")
        products = np.asarray(a["products"], np.float64)
        ax.plot(
            np.cumsum(np.where(np.isfinite(products), products, 0.0)),
            ls="--",
            color=line.get_color(),
            label=f"{a['softmax']}: products part",
        )
        gone = np.flatnonzero(~np.isfinite(total))
        if gone.size:
            ax.plot(
                gone,
                np.zeros(gone.size),
                "x",
                color=line.get_color(),
                ms=6,
                label=f"{a['softmax']}: {gone.size} non-finite element(s), excluded",
            )
    ax.axhline(0, color="k", lw=0.5)
    ax.set(
        xlabel="element of the output row",
        ylabel="cumulative signed error (finite errors)",
        title=f"Cumulative error of O along the row ({where})",
    )
    ax.legend(fontsize=8)
    save(fig, PLOT_FILES[0])


def _blocks(fig, variants: list[dict], blocks: list[tuple], where: str, save) -> None:
    """O so far after each K/V block; ``blocks``: the first variant's, as (index, block, first key, end key,
    P = 1 count)."""
    ax = fig.subplots()
    x = np.arange(len(blocks))
    for a in variants:
        (line,) = ax.plot(x, [e for _i, e in a["block_errors"]], marker="o", label=a["softmax"])
        gone = [i for i, e in a["block_errors"] if math.isnan(e)]
        if gone:
            ax.plot(
                gone,
                np.zeros(len(gone)),
                "x",
                color=line.get_color(),
                ms=8,
                label=f"{a['softmax']}: no finite error at these blocks",
            )
    for index, _block, _k0, _k1, p_one in blocks:
        if p_one >= 2:
            ax.axvspan(index - 0.4, index + 0.4, color="orange", alpha=0.15)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(x, [f"{block}\n[{k0},{k1})" for _i, block, k0, k1, _p in blocks], fontsize=8)
    ax.set(
        xlabel="K/V block, in processing order (shaded: P = 1 at >= 2 keys, standard)",
        ylabel="mean error of acc/l so far vs FP64",
        title=f"Error of O after each K/V block ({where})",
    )
    ax.legend(fontsize=8)
    save(fig, PLOT_FILES[1], bottom=0.2)


def _label(ax, text: str, x: float, color: str) -> None:
    """A step's small vertical label at the foot of its bar."""
    ax.annotate(
        text,
        (x, 0),
        xytext=(0, 2),
        textcoords="offset points",
        ha="center",
        va="bottom",
        rotation=90,
        fontsize=6,
        color=color,
    )


def _steps(fig, variants: list[dict], labels: list[str], where: str, save) -> None:
    """Mean signed error (ulps) and share rounded away per step, bars per variant."""
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    width = 0.8 / max(len(variants), 1)
    pos = np.arange(len(labels))
    for j, a in enumerate(variants):
        by = a["steps"]  # label -> the step's mean_ulps, frac_away, inexact, events, non-finite counts
        xs = pos + j * width
        mean = [by[lab]["mean_ulps"] if lab in by and not math.isnan(by[lab]["mean_ulps"]) else 0.0 for lab in labels]
        bars = ax1.bar(xs, mean, width, label=a["softmax"])
        ax2.bar(
            xs,
            [by[lab]["frac_away"] if lab in by and by[lab]["inexact"] else 0.0 for lab in labels],
            width,
            color=bars.patches[0].get_facecolor() if bars.patches else None,
            label=a["softmax"],
        )
        for x_, lab in zip(xs, labels, strict=True):  # the event count says whether a 0 bar is "no events"
            st = by.get(lab)
            text = (
                "no events"
                if st is None or not st["events"]
                else (
                    f"n={st['events']}"
                    + (f"\n{st['unexpected_nonfinite']} non-finite" if st["unexpected_nonfinite"] else "")
                    + (f"\n{st['expected_nonfinite']} -inf, expected" if st["expected_nonfinite"] else "")
                )
            )
            _label(ax1, text, x_, "grey" if st is None or not st["events"] else "black")
            if st is not None and st["events"] and not st["inexact"]:
                _label(ax2, "exact", x_, "grey")
    ax1.axhline(0, color="k", lw=0.5)
    ax1.set(ylabel="mean signed error (ulps)", title=f"Rounding error per step, this row's events ({where})")
    ax2.axhline(0.5, color="k", lw=0.5, ls="--")
    ax2.set(ylabel="share of inexact results rounded away from 0", ylim=(0, 1))
    ax2.set_xticks(pos + width * (len(variants) - 1) / 2, labels, rotation=30, fontsize=8)
    ax1.legend(fontsize=8)
    save(fig, PLOT_FILES[2], bottom=0.13, hspace=0.12)


def _jsonable(x: object) -> object:
    """numpy arrays and scalars in the data as JSON takes them (a float's repr reads back exactly)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    raise TypeError(f"plot data: {type(x).__name__} is not JSON")


# the Drawer process: this file run alone (runpy), so that nothing but numpy and matplotlib is imported
_RUN_THIS_FILE = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


class Drawer:
    """A process that draws the plots while the caller computes.  Started first, it imports matplotlib (as
    long as the drawing itself) on another core; `send()` hands it the data and returns at once, `wait()`
    returns the files once written.  Use it as a context manager: leaving the block stops a process that was
    not waited for."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_THIS_FILE, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._paths: list[Path] = []

    def send(self, data: dict, out_dir: Path | str) -> None:
        """Hand over what `draw()` takes; the process draws while the caller goes on."""
        out = Path(out_dir)
        self._paths = [out / name for name in PLOT_FILES]
        try:
            self._proc.stdin.write(json.dumps([data, str(out)], default=_jsonable).encode())
            self._proc.stdin.close()
        except BrokenPipeError:  # the process ended early: wait() says why
            pass

    def wait(self) -> list[Path]:
        """The files written; OSError when writing one failed, RuntimeError when the drawing failed."""
        message = self._proc.stderr.read().decode(errors="replace").strip()  # stdin is closed: no communicate()
        self._proc.wait()
        if self._proc.returncode == EXIT_OSERROR:
            raise OSError(message)
        if self._proc.returncode:
            raise RuntimeError(f"drawing the plots failed (status {self._proc.returncode}):\n{message}")
        return self._paths

    def __enter__(self) -> Drawer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        for f in (self._proc.stdin, self._proc.stderr):
            if f is not None and not f.closed:
                f.close()


def _draw_status(data: dict, out: str, names: tuple[str, ...]) -> int:
    """`draw()` as an exit status (`EXIT_OSERROR` when writing failed, the reason on stderr)."""
    try:
        draw(data, out, names)
    except OSError as exc:
        print(exc.strerror or exc, file=sys.stderr)
        return EXIT_OSERROR
    return 0


def _serve() -> int:
    """A Drawer process: import matplotlib, then draw the data read from stdin; where the system forks, the
    step plot (about half the drawing) in a forked copy of this process, on another core."""
    import matplotlib.figure  # noqa: F401  (while the caller computes)

    data, out = json.load(sys.stdin.buffer)  # JSON: NaN and infinities included, floats exact
    first, last = PLOT_FILES[:2], PLOT_FILES[2:]
    if not hasattr(os, "fork"):
        return _draw_status(data, out, first + last)
    pid = os.fork()
    if pid == 0:
        try:
            status = _draw_status(data, out, last)
        except BaseException:  # noqa: BLE001 - the forked copy must end here whatever happens
            traceback.print_exc()
            status = 1
        sys.stderr.flush()
        os._exit(status)
    status = _draw_status(data, out, first)
    forked = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return status or forked


if __name__ == "__main__":
    import gc

    exit_status = _serve()
    gc.freeze()  # the process ends here: no final collection of matplotlib's objects
    raise SystemExit(exit_status)
