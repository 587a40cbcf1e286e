"""The compact recordings (flashsim.recording): digests, patches, bits kept whole, and the mutation tests: one bit
of one output changed, in a recording of every kind (our kernels, SDPA, the paper's pipeline, a probe, a patched
output, bits kept whole), and the check fails, naming the device command that re-records the full bits."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest

from flashsim.recording import Digest, Patch, RecordedRun, Recording, RecordingMismatch, sha256_of
from gpu.crosscheck import others
from gpu.crosscheck.recorded import load_recorded, nan_runs, recorded_runs

DATA = Path(__file__).resolve().parents[1] / "data"


def _flipped(bits: np.ndarray, index: int = 0, bit: int = 0) -> np.ndarray:
    """A copy of `bits` with one bit of one element changed."""
    out = np.array(bits, copy=True)
    out.reshape(-1)[index] ^= out.dtype.type(1 << bit)
    return out


# ---- the format ------------------------------------------------------------------------------------------
def test_digest_names_dtype_shape_and_bytes():
    a = np.arange(12, dtype=np.uint16).reshape(3, 4)
    d = Digest.of(a)
    assert str(d) == f"uint16 3x4 {sha256_of(a)}" and Digest.parse(str(d)) == d
    assert d.matches(a) and d.matches(a.reshape(1, 12))  # a run may drop a batch axis: the bytes are the same
    assert not d.matches(_flipped(a, 5)) and not d.matches(a.astype(np.uint32)) and not d.matches(a[:2])
    assert Digest.parse(str(Digest.of(np.array(7, np.int64)))).shape == ()
    assert Digest.of(np.array(["ab", "c"])).dtype == "<U2"
    for bad in ("uint16 3x4", "uint16 3x4 xyz", "nodtype 3 " + "0" * 64, "uint16 3xq " + "0" * 64):
        with pytest.raises(ValueError, match="digest: expected"):
            Digest.parse(bad)


def test_recording_round_trip_kept_bits_and_patches(tmp_path):
    rng = np.random.default_rng(1)
    device = rng.integers(0, 2**16, (4, 8), dtype=np.uint64).astype(np.uint16)
    emulated = device.copy()
    emulated[1, 2] ^= 3
    arrays = {"in/x": rng.integers(0, 2**32, 5, dtype=np.uint64).astype(np.uint32), "out/y": device, "kept": device}
    meta = {"recording": {"command": "OUT=$OUT bash make_it.sh"}, "seed": 7}
    rec = Recording.of_arrays(meta, arrays, keep=["kept"], patches={"out/y": Patch.between(emulated, device)})
    path = rec.save(tmp_path / "r.json")
    back = Recording.load(path)
    assert back.meta == meta and back.digests == rec.digests and list(back.kept) == ["kept"]
    assert back.keys("out/") == ["out/y"] and "in/x" in back and back.command == "OUT=$OUT bash make_it.sh"
    assert len(back.patches["out/y"]) == 1
    assert np.array_equal(back.bits("out/y", emulated), device)  # rebuilt from the emulator and the patch
    assert np.array_equal(back.bits("kept"), device)
    with pytest.raises(RecordingMismatch, match=r"make_it\.sh") as exc:
        back.bits("out/y", _flipped(emulated, 7))  # an element the patch does not cover
    assert "r.json: out/y" in str(exc.value) and "docs/crosscheck.md" in str(exc.value)
    back.verify_all({"in/x": arrays["in/x"]})
    with pytest.raises(RecordingMismatch, match="in/x: the regenerated bits"):
        back.verify_all({"in/x": _flipped(arrays["in/x"])})
    rec.kept, rec.patches = {}, {}
    rec.save(path)
    assert not path.with_suffix(".npz").exists()  # nothing kept: no npz beside the JSON


def test_damaged_kept_bits_are_refused(tmp_path):
    bits = np.arange(64, dtype=np.uint32)
    path = Recording.of_arrays({}, {"a": bits}, keep=["a"]).save(tmp_path / "r.json")
    np.savez_compressed(path.with_suffix(".npz"), a=_flipped(bits, 9, 31))
    with pytest.raises(RecordingMismatch, match="the kept bits"):
        Recording.load(path)
    np.savez_compressed(path.with_suffix(".npz"), b=bits)
    with pytest.raises(ValueError, match="keeps 'b', which r.json has no digest of"):
        Recording.load(path)
    path.write_text('{"cases": []}')
    with pytest.raises(ValueError, match="no 'digests'"):
        Recording.load(path)


# ---- mutation tests: one bit of one recorded output ------------------------------------------------------------
def _first(runs: list[RecordedRun], backward: bool = False) -> RecordedRun:
    return next(r for r in runs if r.backward == backward)


@functools.cache
def _ours() -> list[RecordedRun]:
    return recorded_runs()


KINDS = {
    "ours_forward": lambda: _first(_ours()),
    "ours_backward": lambda: _first(_ours(), backward=True),
    "ours_fp8": lambda: next(r for r in _ours() if r.dtype == "e4m3"),
    "tutorial": lambda: _first(others.recorded_runs(DATA / "others", "tutorial"), backward=True),
    "sdpa_flash": lambda: _first(others.recorded_runs(DATA / "sdpa_flash"), backward=True),
    "sdpa_efficient": lambda: _first(others.recorded_runs(DATA / "sdpa_efficient")),
    "paper": lambda: _first(others.recorded_runs(DATA / "paper"), backward=True),
    "nan_backward_kept_bits": lambda: nan_runs()[0],
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_flipped_bit_of_a_kernel_output_fails_the_check(kind, monkeypatch):
    """The emulator's outputs pass; the same with one bit of one output changed (each output in turn) do not: the
    digest differs, the check says which output and how to see the elements."""
    run = KINDS[kind]()
    emu = run.emulate()
    assert all(run.matches(emu).values()), kind
    for name in run.names:
        bad = dict(emu, **{name: _flipped(emu[name], index=emu[name].size // 2, bit=3)})
        assert run.matches(bad) == {n: n != name for n in run.names}, (kind, name)
    name = run.names[-1]
    monkeypatch.setattr(run, "emulate", lambda policy=None: dict(emu, **{name: _flipped(emu[name])}))
    rep = run.check(counts=False)
    assert not rep.identical and not rep.same[name] and sum(rep.same.values()) == len(rep.same) - 1
    assert f"{name:>5}: differs from the recorded bits" in str(rep) and run.recording.command in str(rep)


@pytest.mark.parametrize("kind", ["ours_forward", "paper"])
def test_one_flipped_bit_of_a_recorded_digest_fails_the_check(kind, monkeypatch):
    """The other way round: the recording's digest of one output changed to that of the bits with one bit flipped."""
    run = KINDS[kind]()
    key = run.keys["o"]
    gpu = run.outputs()["o"]
    monkeypatch.setitem(run.recording.digests, key, Digest.of(_flipped(gpu, index=1)))
    assert not run.check(counts=False).same["o"]


def run_patch(run: RecordedRun, name: str) -> Patch | None:
    """The recording's patch of output `name` of `run` (None: the emulator gives the GPU's bits)."""
    return run.recording.patches.get(run.keys[name])


def test_a_patched_output_with_one_flipped_bit_is_refused(monkeypatch):
    """A patched output (cuDNN's dQ, kept as an earlier model's dQ with the GPU's elements where they differed): the
    GPU's dQ is rebuilt from any emulation by putting the patch's elements back and proven by its digest; an
    emulation that differs from the GPU's bits outside the patch fails the rebuild, and so do the counts that
    need it."""
    run = next(r for r in others.recorded_runs(DATA / "sdpa_cudnn") if r.backward and run_patch(r, "dq"))
    emu = run.emulate()
    gpu = run.outputs()["dq"]
    patch = run_patch(run, "dq")
    assert np.array_equal(patch.apply(emu["dq"]), gpu)  # the rebuild the digest proved
    outside = int(np.setdiff1d(np.arange(gpu.size), patch.index.astype(np.int64))[0])
    fresh = next(r for r in others.recorded_runs(DATA / "sdpa_cudnn") if r.note == run.note)  # nothing proven yet
    monkeypatch.setattr(fresh, "emulate", lambda policy=None: dict(emu, dq=_flipped(emu["dq"], index=outside)))
    with pytest.raises(RecordingMismatch, match="sdpa_cudnn/others.json"):
        fresh.outputs()
    with pytest.raises(RecordingMismatch):
        fresh.check(policy=fresh.resolve_policy())  # counts under another policy need the GPU's bits


def test_a_flipped_bit_fails_the_probe_checks():
    """Probes: an mma tile's output and the CUDA division's NaN-encoding patch."""
    import ml_dtypes

    import emufloat as ef
    from emufloat.hw import h100
    from emufloat.ops import div
    from studies.probes import inputs as probe_inputs

    mma = Recording.load(DATA / "h100" / "mma.json")
    x = probe_inputs.stress_tiles(mma.meta["seed"], formats=("bf16",))
    a, bt = (x[f"bf16_K16_noc_{p}"].view(ml_dtypes.bfloat16) for p in ("a", "bt"))
    d = np.stack([ef.matmul(a[t], bt[t].T, h100.WGMMA_BF16) for t in range(len(a))]).view(np.uint32)
    mma.verify("bf16_K16_noc_d", d)
    with pytest.raises(RecordingMismatch, match=r"bf16_K16_noc_d: .*studies/device/run_probes\.sh"):
        mma.verify("bf16_K16_noc_d", _flipped(d, index=100, bit=0))
    cm = Recording.load(DATA / "h100" / "cuda_math.json")
    xs = probe_inputs.cuda_math_inputs(cm.meta["seed"], keep=cm.meta["per_part"])["x"].view(np.float32)
    got = div(np.float32(1.0), xs, ef.FP32).view(np.uint32)
    cm.bits("rcp", got)
    with pytest.raises(RecordingMismatch, match=r"rcp: .*studies\.probes\.cuda_math"):
        cm.bits("rcp", _flipped(got, index=int(np.flatnonzero(~np.isnan(xs))[0])))


def test_kept_debug_run_with_a_flipped_bit_is_seen_by_the_divergence_report():
    """The runs kept whole for the first-divergence tests (recorded.npz): a flipped bit of a kept intermediate is a
    divergence the report locates."""
    from flashsim.crosscheck import first_divergence

    rec = load_recorded()
    run = next(r for r in _ours() if r.debug and not r.causal).kernel_run()
    assert any(k.endswith("/dbg_acc") for k in rec.kept)
    assert first_divergence(run, 0, 3).step is None
    acc = run.debug["acc"].copy()
    acc[0, 0, 3, 5] ^= 1
    div = first_divergence(dataclasses.replace(run, debug=run.debug | {"acc": acc}), 0, 3)
    assert (div.step, div.quantity, div.column) == (0, "acc", 5)
