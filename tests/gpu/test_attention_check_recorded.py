"""Every recorded GPU run against FP64 attention of its inputs (flashsim.bounds.check_attention): the kernels
that compute attention are never flagged; the only runs flagged are those whose O is not finite where attention
is (an intermediate overflowed: our kernels' NaN-row recordings and the stabilised fix on large fp16 scores),
and none of those has a finite element beyond its bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashsim.bounds import check_attention
from flashsim.crosscheck import from_bits, stored_formats
from gpu.crosscheck import others
from gpu.crosscheck.recorded import recorded_runs

DATA = Path(__file__).resolve().parents[1] / "data"
FOLDERS = ("others", "sdpa_flash", "sdpa_efficient", "sdpa_efficient_det", "sdpa_cudnn", "paper", "paper_640")


def _check(run):
    pol, out = run.resolve_policy(), run.outputs()
    o = from_bits(out["o"], stored_formats(pol)["o"])
    lse = from_bits(out["lse"], None) if "lse" in out else None
    return check_attention(run.q, run.k, run.v, o, lse, pol, run.softmax, run.sm_scale, run.causal)


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS)
def test_other_kernels_compute_attention(folder):
    runs = others.recorded_runs(DATA / folder)
    assert runs
    flagged = [(r.note, str(c)) for r in runs if not (c := _check(r)).attention]
    assert flagged == []


@pytest.mark.slow
def test_our_kernels_compute_attention_where_their_outputs_are_finite():
    runs = recorded_runs()
    checks = [(r.note, _check(r)) for r in runs]
    assert len(checks) > 400
    flagged = [(note, c) for note, c in checks if not c.attention]
    assert all(c.nonfinite > 0 and c.beyond == 0 and c.lse_beyond == 0 for _note, c in flagged), flagged
    assert len(flagged) <= 3, [note for note, _c in flagged]
