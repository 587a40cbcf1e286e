"""trace-row's plots: drawn from plain data, the same in a Drawer process as in this one; a Drawer's failure comes
back to the caller, and a Drawer never outlives its block."""

import numpy as np
import pytest

from flashsim.analysis import plots

pytest.importorskip("matplotlib")


def _data() -> dict:
    rng = np.random.default_rng(1)
    total = rng.standard_normal(16) * 1e-3
    total[3] = np.nan  # a non-finite element: its marker and the banner
    steps = {
        "scores": {
            "mean_ulps": 0.1,
            "frac_away": 0.5,
            "inexact": 3,
            "events": 4,
            "unexpected_nonfinite": 0,
            "expected_nonfinite": 1,
        }
    }
    variant = {
        "softmax": "standard",
        "total": total,
        "products": total / 2,
        "block_errors": [(0, 1e-3), (1, float("nan"))],
        "steps": steps,
    }
    return {
        "where": "qiu_yao, row 0",
        "banner": "NON-FINITE (excluded from every curve): standard: O[3]",
        "blocks": [(0, 0, 0, 8, 2), (1, 1, 8, 16, 0)],
        "labels": ["scores", "exp"],
        "variants": [variant, {**variant, "softmax": "stabilised"}],
    }


def test_a_drawer_draws_what_draw_draws(tmp_path):
    from PIL import Image

    here = plots.draw(_data(), tmp_path / "here")
    with plots.Drawer() as drawer:
        drawer.send(_data(), tmp_path / "there")
        there = drawer.wait()
    assert [p.name for p in here] == [p.name for p in there] == list(plots.PLOT_FILES)
    for a, b in zip(here, there, strict=True):
        np.testing.assert_array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))


def test_a_drawer_that_cannot_write_raises_oserror(tmp_path):
    (tmp_path / "file").write_text("")
    with plots.Drawer() as drawer:
        drawer.send(_data(), tmp_path / "file" / "plots")  # a folder inside a file
        with pytest.raises(OSError):
            drawer.wait()


def test_a_drawer_not_waited_for_is_stopped():
    with plots.Drawer() as drawer:
        proc = drawer._proc
    assert proc.poll() is not None
