"""emufloat.hw.torch_cuda.row_sum_tree for rows that start off a 16-byte boundary (a head before the first whole
vector, a tail after the last) against torch.sum's bits recorded on an H200 (tests/data/h100/torch_sum_widths.json:
the SHA-256 of each launch's outputs; inputs regenerated from the recording's seed)."""

from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
from emufloat.hw import torch_cuda
from flashsim.recording import Recording, RecordingMismatch
from studies.probes.inputs import sum_rows_inputs

REC = Recording.load(Path(__file__).resolve().parents[1] / "data" / "h100" / "torch_sum_widths.json")
INPUTS = sum_rows_inputs(REC.meta["seed"])


def model_sums(key: str) -> np.ndarray:
    """The model's row sums of one launch (`torch_cuda.row_sums`: row r starts r n values into the tensor)."""
    itemsize = int(key.split("_")[0][1:])
    return torch_cuda.row_sums(INPUTS[key], itemsize).view(np.uint32)


def aligned_sums(key: str) -> np.ndarray:
    """Every row summed as if it started on a 16-byte boundary (the model before heads and tails)."""
    itemsize, n, rows = (int(part[1:]) for part in key.split("_"))
    tree = torch_cuda.row_sum_tree(n, rows, itemsize)
    return np.asarray(ef.tree_sum(INPUTS[key], tree), np.float32).view(np.uint32)


def test_the_recording_covers_every_launch():
    assert sorted(REC.keys()) == sorted(INPUTS) and len(INPUTS) == 136


@pytest.mark.parametrize("key", sorted(INPUTS))
def test_every_row_sum_is_the_gpus(key):
    REC.verify(key, model_sums(key))


def test_the_shift_matters():
    """Taking every row as aligned (the model before heads and tails) misses the GPU's bits."""
    missed = []
    for key in ("s4_n150_r150", "s4_n333_r16", "s4_n511_r512"):
        try:
            REC.verify(key, aligned_sums(key))
        except RecordingMismatch:
            missed.append(key)
    assert missed == ["s4_n150_r150", "s4_n333_r16", "s4_n511_r512"]
