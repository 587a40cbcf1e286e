"""What the H100 models share: their package data, the NaN the GPU writes, the grid of its tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..calibration import DataFolder

#: the room's package data: ex2.npz, rcp.npz, lg2.npz (tables), reduction_trees.json (recorded tl.sum trees)
DATA = DataFolder(Path(__file__).resolve().parent / "data", "h100")

#: float32 bits of the NaN the H100's FP32 units write (emufloat's own quiet NaN is 0x7fc00000)
CANONICAL_NAN = np.uint32(0x7FFFFFFF)

#: the ex2 and rcp tables hold one entry per multiple of 2**-GRID_BITS
GRID_BITS = 23
NGRID = 1 << GRID_BITS
