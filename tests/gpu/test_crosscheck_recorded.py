"""The emulator reproduces our Triton kernels bit for bit: every recorded H100 case, checked on the CPU.

Recorded by `OUT=$OUT bash studies/device/run_attention.sh --sections record` (provenance in
gpu/data/recorded.json, which keeps the SHA-256 of every output: flashsim.recording); inputs are regenerated
from their seeds (gpu/crosscheck/cases.py), the emulator's outputs hashed and compared.
"""

from pathlib import Path

import numpy as np
import pytest

from emufloat.hw import h100
from flashsim.crosscheck import check_bits as check
from gpu.crosscheck import load_recorded
from gpu.crosscheck.cases import Case
from gpu.crosscheck.recorded import case_recorded_run

REC = load_recorded()
META = REC.meta
FORWARD = [Case(**c) for c in META["record"]["forward"] if f"f/{Case(**c).key}/o" in REC]
BACKWARD = [Case(**c) for c in META["record"]["backward"]]


def test_enough_recorded_cases():
    assert len(FORWARD) >= 200 and len(BACKWARD) >= 50
    assert {c.dtype for c in FORWARD} == {"bf16", "fp16"} and {c.d for c in FORWARD} == {64, 128}
    assert {c.softmax for c in FORWARD} == {"standard", "stabilised", "robust"}
    assert {c.causal for c in FORWARD} == {False, True}
    assert any(c.n_q % 64 for c in FORWARD) and any(c.n_q != c.n_k for c in FORWARD)
    assert all(f"b/{c.key}/{n}" in REC for c in BACKWARD for n in ("o", "lse", "dq", "dk", "dv", "delta"))


def _attention_or_overflow(rep) -> bool:
    """Attention within rounding, or O non-finite where attention is finite (the stabilised fix's fp16 overflow on
    large scores) with no finite element beyond the bound."""
    a = rep.attention
    return a.attention or (a.nonfinite > 0 and a.beyond == 0 and "stabilised_large" in rep.note)


@pytest.mark.parametrize("chunk", range(8))
def test_forward_bit_identical(chunk):
    """Every element, NaNs included: where the stabilised fix's l underflows (O = 0/0) the kernel writes
    0x7FFF (div.full's canonical NaN, payload kept by cvt), which the policy's output step models."""
    for case in FORWARD[chunk::8]:
        rep = case_recorded_run(case, REC, "f").check(counts=False)
        assert list(rep.same) == ["o", "lse"] and rep.identical, str(rep)
        assert _attention_or_overflow(rep), str(rep)


@pytest.mark.parametrize("chunk", range(3))
def test_backward_bit_identical(chunk):
    for case in BACKWARD[chunk::3]:
        rep = case_recorded_run(case, REC, "b").check(counts=False)
        assert len(rep.same) == 6 and rep.identical, str(rep)
        assert rep.attention.attention, str(rep)


def test_log2_fma_bit_identical_to_the_kernel():
    """The kernels' log2_fma on a sample of run_attention.sh's log2 inputs (tests/data/h100/attention/log2.json:
    the SHA-256 of the GPU's outputs; the sample's positions in log2.npz)."""
    from flashsim.recording import Recording
    from studies.probes.inputs import log2_fma_inputs

    rec = Recording.load(Path(__file__).parents[1] / "data" / "h100" / "attention" / "log2.json")
    x = log2_fma_inputs()[np.cumsum(rec.kept["index"], dtype=np.int64)]
    rec.verify("x", x)
    assert x.size >= 40_000
    rec.verify("y", h100.log2_fma(x.view(np.float32)).view(np.uint32))


def test_check_reports_differences():
    a = np.array([0x3F80, 0x3F81, 0x7FC0], np.uint16)
    b = np.array([0x3F80, 0x3F83, 0x7FFF], np.uint16)
    res = check("x", a, b, "bf16")
    assert res.identical == 1 and not res.nan_only and res.ulp_hist == {2: 1}
    res = check("x", a[[0, 2]], b[[0, 2]], "bf16")
    assert res.identical == 1 and res.nan_only


# ---- FP8 E4M3 forward -------------------------------------------------------------------------------------
def test_fp8_forward_bit_identical():
    """Recorded by `OUT=$OUT bash studies/device/run_attention.sh --sections fp8` (gpu/data/recorded.json, 'fp8'):
    q, k, v and P in e4m3 on the fp8 tensor cores, O in bf16; emulated by gpu.policies.triton_policy('e4m3')."""
    cases = [Case(**c) for c in META["fp8"]["cases"] if f"f8/{Case(**c).key}/o" in REC]
    assert len(cases) >= 40 and {c.softmax for c in cases} == {"standard", "stabilised", "robust"}
    for case in cases:
        rep = case_recorded_run(case, REC, "f8").check(counts=False)
        assert list(rep.same) == ["o", "lse"] and rep.identical, str(rep)
        assert rep.attention.attention, str(rep)


def test_fp8_recording_pins_its_query_tiles():
    """The 333 x 150 causal cases at d=128 tell FP8's 64-row tiles (gpu.configs.FP8_FWD_CONFIGS, with which
    the H100 recorded them) from the bf16 kernel's 128-row ones: emulated with those, some output differs."""
    from gpu.configs import FWD_CONFIGS, fwd_config

    assert fwd_config("e4m3", 128, True) != FWD_CONFIGS[(128, True)]
    cases = [
        Case(**c) for c in META["fp8"]["cases"] if (c["n_q"], c["n_k"], c["d"], c["causal"]) == (333, 150, 128, True)
    ]
    assert len(cases) == 3
    differ = 0
    for case in cases:
        assert case_recorded_run(case, REC, "f8").check(counts=False).identical
        differ += not case_recorded_run(case, REC, "f8", fwd=FWD_CONFIGS[(128, True)]).check(counts=False).identical
    assert differ >= 1


# ---- KernelRun files, the divergence report, the CLI ------------------------------------------------------
def _debug_run():
    """A recorded run kept whole (recorded.npz), with its per-block intermediates, as a KernelRun."""
    from gpu.crosscheck import recorded_runs

    return next(r for r in recorded_runs() if r.debug and not r.causal).kernel_run()


def _multi_block_run():
    """A run whose 'kernel' side is the emulator itself, with per-block intermediates from the stepper: the
    divergence search must find exactly the element a test perturbs (4 K/V blocks)."""
    import flashsim as fs
    from flashsim.crosscheck import KernelRun, emulate, to_bits
    from gpu.crosscheck.cases import batch
    from gpu.policies import kernel_policy_args, kernel_policy_ref

    x = batch("repeated", "bf16", (1, 1, 130, 64), 11, n_k=200)
    q, k, v = x["q"][0], x["k"][0], x["v"][0]
    args = kernel_policy_args("bf16", 64, False)
    ref = kernel_policy_ref("bf16", 64, False)
    pol = ref.resolve()
    n_blk = -(-200 // args["block_n"])
    dbg = {
        "m": np.full((1, n_blk, 130), np.nan, np.float32),
        "l": np.full((1, n_blk, 130), np.nan, np.float32),
        "p": np.full((1, n_blk, 130, args["block_n"]), np.nan, np.float32),
        "acc": np.full((1, n_blk, 130, 64), np.nan, np.float32),
    }
    for start in range(0, 130, args["block_m"]):
        rows = slice(start, min(start + args["block_m"], 130))
        for st in fs.step_rows(q[0], k[0], v[0], pol, rows=rows, softmax="robust", trace=False):
            dbg["m"][0, st.block, rows] = st.m
            dbg["l"][0, st.block, rows] = st.l
            dbg["p"][0, st.block, rows, : st.p_exp.shape[1]] = st.p_exp
            dbg["acc"][0, st.block, rows] = st.acc
    run = KernelRun(
        q=q,
        k=k,
        v=v,
        dtype="bf16",
        causal=False,
        sm_scale=0.125,
        softmax=fs.get_softmax("robust"),
        policy=ref,
        outputs={"o": np.zeros((1, 130, 64), np.uint16), "lse": np.zeros((1, 130), np.uint32)},
        debug={n: to_bits(a, None) for n, a in dbg.items()},
    )
    run.outputs.update(emulate(run))
    return run


def test_first_divergence_finds_the_perturbed_element():
    from flashsim.crosscheck import crosscheck, first_divergence

    run = _multi_block_run()
    assert crosscheck(run).identical and first_divergence(run, 0, 129).step is None
    for key, idx, col in (
        ("acc", (0, 3, 129, 17), 17),
        ("p", (0, 2, 129, 5), 5),
        ("m", (0, 1, 129), None),
        ("l", (0, 3, 129), None),
    ):
        saved = run.debug[key].copy()
        run.debug[key][idx] ^= 1
        div = first_divergence(run, 0, 129)
        assert (div.block, div.step, div.quantity, div.column, div.ulps) == (idx[1], idx[1], key, col, 1), div
        run.debug[key] = saved
    # an earlier step wins over a later one; within a step m, P, l, acc are checked in that order
    run.debug["acc"][0, 1, 129, 0] ^= 2
    run.debug["l"][0, 2, 129] ^= 1
    div = first_divergence(run, 0, 129)
    assert (div.step, div.quantity, div.ulps) == (1, "acc", 2) and "step 1 (K/V block 1), acc[0]" in str(div)


def test_crosscheck_reports_the_first_differing_row(tmp_path):
    from flashsim.crosscheck import crosscheck, load_run, save_run

    run = _debug_run()
    path = save_run(tmp_path / "run.npz", run)
    back = load_run(path)
    assert back.softmax == run.softmax and back.policy == run.policy and crosscheck(back).identical
    back.outputs["o"][0, 5, 3] ^= 0x0001
    rep = crosscheck(back)
    assert not rep.identical and rep.first_row == (0, 5)
    assert rep.divergence.step is None and "after the K/V loop" in str(rep)
    assert "1 ulp: 1" in str(rep.checks[0])
    back.debug = {}
    assert "no per-block intermediates recorded" in str(crosscheck(back))


def test_flashsim_crosscheck_cli(tmp_path, capsys):
    from flashsim.cli import main
    from flashsim.crosscheck import load_run, save_run

    run = _debug_run()
    save_run(tmp_path / "a.npz", run)
    assert main(["crosscheck", str(tmp_path)]) == 0
    assert "1 run: 1 bit-identical" in capsys.readouterr().out
    bad = load_run(tmp_path / "a.npz")
    bad.outputs["lse"][0, 2] ^= 1
    save_run(tmp_path / "b.npz", bad)
    assert main(["crosscheck", str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]) == 1
    out = capsys.readouterr().out
    assert "lse: 15 of 16 bit-identical" in out and "2 runs: 1 bit-identical" in out
    assert main(["crosscheck", str(tmp_path / "missing.npz")]) == 2
    assert "RUN: no such file" in capsys.readouterr().err


def test_kernel_run_checks_its_arguments():
    from flashsim.crosscheck import KernelRun, crosscheck

    run = _debug_run()
    kw = dict(
        q=run.q, k=run.k, v=run.v, dtype="bf16", causal=False, sm_scale=0.125, softmax=run.softmax, policy=run.policy
    )
    with pytest.raises(ValueError, match="dtype: expected one of"):
        KernelRun(**(kw | {"dtype": "fp8"}), outputs=run.outputs)
    with pytest.raises(ValueError, match=r"outputs: missing 'o'"):
        KernelRun(**kw, outputs={"lse": run.outputs["lse"]})
    o_only = KernelRun(**kw, outputs={"o": run.outputs["o"]})  # a kernel without an LSE: O alone is checked
    assert [c.name for c in crosscheck(o_only).checks] == ["o"] and crosscheck(o_only).identical
    with pytest.raises(ValueError, match=r"outputs\['o'\]: expected uint16 bits of shape"):
        KernelRun(**kw, outputs={"o": run.outputs["o"].astype(np.uint32), "lse": run.outputs["lse"]})
    with pytest.raises(ValueError, match="do: a run with backward outputs"):
        KernelRun(**kw, outputs=run.outputs | {"dq": run.outputs["o"]})


def test_output_step_nan_encoding():
    """The H100's output cast writes NaN as 0x7FFF (recorded: the stabilised fix's 0/0 rows); Op.nan_bits
    models it and refuses encodings that are not NaNs of the format."""
    from flashsim import arith
    from flashsim.specs import Op

    got = arith.output_cast(np.float32([np.nan, -np.nan, 1.5, -0.0]), Op("bf16", nan_bits=0x7FFF))
    assert got.view(np.uint16).tolist() == [0x7FFF, 0x7FFF, 0x3FC0, 0x8000]
    plain = arith.output_cast(np.float32([np.nan]), Op("bf16"))
    assert np.isnan(plain.astype(np.float32)).all() and plain.view(np.uint16)[0] != 0x7FFF
    for bad in (0x3F80, 1 << 16, -1, 0x7FFF + 0.5):
        with pytest.raises(ValueError, match="Op.nan_bits: expected an encoding of a NaN of bf16"):
            Op("bf16", nan_bits=bad)


def test_replay_start_and_stop_bookkeeping():
    """studies/device/run_attention.py --sections replay --replay-from K: the start is checked against the recording,
    and
    the result says which runs a call compared (no GPU needed for the cases that run nothing; the script needs
    torch and Triton to import)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gpu.crosscheck import recorded_runs
    from studies.device.run_attention import replay

    n = len(recorded_runs())
    for bad in (-1, n + 1):
        with pytest.raises(ValueError, match=rf"--replay-from must be in 0\.\.{n} \(recorded runs\), got {bad}"):
            replay({}, float("inf"), bad)
    res: dict = {}
    replay(res, float("inf"), n)  # from the end: nothing left to compare
    assert res["replay"] == {"identical": 0, "differ": [], "runs": [n, n], "of": n}
    res = {}
    replay(res, 0.0, 5)  # past the deadline before the first run
    assert res["replay_stopped"] == f"time, before run 5 of {n}" and res["replay"]["runs"] == [5, 5]


def test_same_bits_holds_tensors_to_their_bits():
    """gpu.crosscheck.same_bits, how the experiments and the replay compare two kernels' outputs: -0 is not +0,
    a NaN equals only the same NaN, shapes must match, and the tuples must pair up."""
    torch = pytest.importorskip("torch")
    from gpu.crosscheck import same_bits

    a = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.bfloat16)
    assert same_bits((a, a.float()), (a.clone(), a.float().clone()))
    assert not same_bits((a,), (torch.tensor([1.0, 0.0, float("nan")], dtype=torch.bfloat16),))
    other_nan = a.view(torch.int16).clone()
    other_nan[2] += 1
    assert not same_bits((a,), (other_nan.view(torch.bfloat16),))
    assert not same_bits((a,), (a[:2],))
    with pytest.raises(ValueError):
        same_bits((a, a), (a,))
