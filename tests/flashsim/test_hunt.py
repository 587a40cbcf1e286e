"""The family space and the hunt for leaning inputs (flashsim.analysis.space, flashsim.analysis.hunt)."""

from __future__ import annotations

import numpy as np
import pytest

from flashsim.analysis.experiments import reference
from flashsim.analysis.hunt import HuntSettings, Lean, hunt, neighbour, random_point
from flashsim.analysis.space import P_BAND, POINTS, FamilyPoint
from flashsim.policy import PolicyRef
from flashsim.sweep.engines import ConfirmationError, EmulatorEngine


def test_a_family_regenerates_its_rows_from_a_seed_in_any_chunks():
    point = FamilyPoint(ties=3, near=5, near_gap=0.5, placement="split", block=16, n_keys=64, v_corr=0.3)
    whole = point.rows(12, seed=9)
    part = point.rows(5, seed=9, first_row=4)
    for name in ("q", "k", "v", "do"):
        assert np.array_equal(getattr(whole, name)[4:9], getattr(part, name))
    assert not np.array_equal(point.rows(12, seed=10).v, whole.v)


def test_scores_are_the_family_s_maxima_near_keys_and_rest():
    point = FamilyPoint(ties=3, near=7, near_gap=2.0, row_max=0.0, others_gap=10.0, spread=5.0, n_keys=64)
    rows = point.rows(6, seed=1)
    s = rows.k[:, :, 0].astype(np.float64)  # q = e_0
    assert (s == 0.0).sum(axis=1).tolist() == [3] * 6
    assert (s == -2.0 * P_BAND["bf16"]).sum(axis=1).tolist() == [7] * 6
    assert (s[(s != 0) & (s != -2.0 * P_BAND["bf16"])] <= -10.0 + 0.1).all()
    assert rows.ties.tolist() == [3] * 6


def test_split_puts_each_maximum_in_its_own_block():
    rows = FamilyPoint(ties=4, placement="split", block=16, n_keys=64, row_max=1.0).rows(8, seed=2)
    for s in rows.k[:, :, 0]:
        blocks = np.flatnonzero(s == s.max()) // 16
        assert len(set(blocks.tolist())) == 4


def test_a_family_is_a_toml_table_and_bad_parameters_are_named():
    import tomllib

    point = FamilyPoint(ties=2, near=3, placement="last", fmt="fp16", v_mean=0.25)
    assert FamilyPoint.from_dict(tomllib.loads(point.to_toml())["family"]) == point
    with pytest.raises(ValueError, match="unknown parameter"):
        FamilyPoint.from_dict({"tie": 2})
    with pytest.raises(ValueError, match="ties, near"):
        FamilyPoint(ties=100, near=100, n_keys=128)
    with pytest.raises(ValueError, match="placement"):
        FamilyPoint(placement="middle")
    with pytest.raises(ValueError, match="v_corr"):
        FamilyPoint(v_corr=2.0)


def test_the_shipped_families_are_points_and_the_moves_stay_in_the_space():
    assert set(POINTS) == {"ties", "single", "dense", "sinks"}
    rng = np.random.default_rng(0)
    for _ in range(30):
        p = random_point(rng, ("bf16", "fp16"), (("ties", 1),))
        assert p.ties == 1 and neighbour(p, rng, ("bf16", "fp16"), (("ties", 1),)).ties == 1
    for point in POINTS.values():
        assert np.isfinite(reference(point.rows(3, seed=1)).o).all()


def test_lean_interval_and_test_of_exceeding_the_margin():
    lean = Lean(100, 3e-4, 5e-5)
    lo, hi = lean.ci()
    assert lo < 3e-4 < hi and abs((hi - lo) / 2 - 1.984 * 5e-5) < 1e-7
    assert lean.p_beyond(1e-4) < 1e-3 and Lean(100, 1.2e-4, 5e-5).p_beyond(1e-4) > 0.3


def _slice(softmax: str) -> HuntSettings:
    """A cheap hunt over families without repeated maxima (ties=1), 64 keys."""
    return HuntSettings(
        policy="triton_h100",
        softmax=softmax,
        start_points=10,
        rows0=24,
        rounds=2,
        confirm_rows=240,
        confirm_top=2,
        seed=3,
        fixed=(("ties", 1), ("n_keys", 64), ("dense", 0.0)),
        budget_s=600,
    )


def test_a_cheap_hunt_finds_the_near_maximum_lean_of_the_standard_softmax(tmp_path):
    """Keys just below the row max give P that rounds up to 1 in BF16 while l sums them unrounded: the standard
    softmax leans; the hunt finds it, confirmed on fresh rows beyond the margin with Holm over what it tried."""
    report = hunt(_slice("standard"), tmp_path)
    assert report.beyond, [f.confirm for f in report.found]
    worst = report.beyond[0]
    assert worst.point.near > 0 and abs(worst.confirm.mean) > 3e-4
    assert (tmp_path / "report.json").is_file() and (tmp_path / "family_1.toml").is_file()
    again = hunt(_slice("standard"), tmp_path)  # resumed from the cache: the same report
    assert [f.confirm for f in again.found] == [f.confirm for f in report.found]


def test_with_the_lean_removed_from_the_model_the_same_hunt_finds_nothing():
    """Mutation: l summed from P as cast (cast_sum) removes that lean; the same hunt confirms nothing."""
    report = hunt(_slice("cast_sum"))
    assert not report.beyond, [(f.point.describe(), f.confirm) for f in report.beyond]


def test_a_hunt_on_a_dask_cluster_is_the_hunt_in_one_process(tmp_path):
    """The families measured by a dask cluster's workers (`hunt(client=...)`, `flashsim hunt --scheduler`): the
    same families tried, the same leans confirmed, as measured here."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        with distributed.Client(cluster) as client:
            on_cluster = hunt(_slice("standard"), tmp_path / "cluster", client=client)
    here = hunt(_slice("standard"), tmp_path / "here")
    assert on_cluster.tried == here.tried and on_cluster.rows == here.rows
    assert [(f.point, f.confirm) for f in on_cluster.found] == [(f.point, f.confirm) for f in here.found]


class _LyingEngine(EmulatorEngine):
    """A row engine whose O differs from the emulator's in the last bit of each row's first element."""

    def compute_o(self, rows, cells):
        out = super().compute_o(rows, cells)
        for o in out.values():
            o.reshape(o.shape[0], -1)[:, 0].view(np.uint16)[...] ^= 1
        return out


def test_a_hunt_on_a_row_engine_is_confirmed_row_by_row(tmp_path):
    """`hunt(engine=...)` / `flashsim hunt --engine NAME`: an engine's O, confirmed on some rows of every measurement
    against the emulator, gives the report the emulator gives; an engine that differs stops the hunt."""
    ref = PolicyRef("triton_h100")
    on_engine = hunt(_slice("standard"), tmp_path / "engine", engine=EmulatorEngine(name="echo"), policy_ref=ref)
    here = hunt(_slice("standard"), tmp_path / "here")
    assert [(f.point, f.confirm) for f in on_engine.found] == [(f.point, f.confirm) for f in here.found]
    with pytest.raises(ConfirmationError, match="engine lying: O differs from the emulator's"):
        hunt(_slice("standard"), engine=_LyingEngine(name="lying"), policy_ref=ref)
