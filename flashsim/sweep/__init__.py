"""Sweeps: a declarative grid (TOML) of policies, softmax variants, keys, tiles, head dimensions, input
families, formats and seeds, computed on dask.distributed into a Parquet dataset, resumable after any kill.

- [`spec`][flashsim.sweep.spec]: the spec file, checked in full, expanded into cells and input groups;
- [`work`][flashsim.sweep.work]: one task (a chunk of rows of a group, every cell of it), a pure function;
- [`engines`][flashsim.sweep.engines]: what computes O (the emulator, or a plug-in such as the GPU's for the cells it
  reproduces bit for bit, confirmed on sampled rows);
- [`store`][flashsim.sweep.store]: the output folder, one Parquet file per cell, every write atomic;
- [`run`][flashsim.sweep.run]: the Dask client: plan what is left, compute, store, progress;
- [`report`][flashsim.sweep.report]: tables and plots from the Parquet alone.

``flashsim sweep SPEC`` and ``flashsim sweep report DIR`` are the command line (docs/sweeps.md).
"""

from .spec import Cell, Group, SpecError, SweepSpec, describe, load_spec, parse_spec
from .store import open_store, read_results

__all__ = [
    "Cell",
    "Group",
    "SpecError",
    "SweepSpec",
    "describe",
    "load_spec",
    "open_store",
    "parse_spec",
    "read_results",
    "run_sweep",
]


def __getattr__(name: str):
    if name == "run_sweep":  # imports dask only when a sweep runs
        from .run import run_sweep

        return run_sweep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
