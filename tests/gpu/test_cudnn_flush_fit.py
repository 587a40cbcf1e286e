"""studies.cudnn_flush_fit on a recording made here: "GPU" bits from a known variant (the normalisation keeping
subnormals, every other step flushing) on subnormal-product launches of the fresh_check grid; the fit must name
that variant as the one reproducing every launch, and the policy's all-flushed model must miss some."""

import json

import numpy as np
import pytest

from flashsim.policy import PolicyRef
from gpu.policies import sdpa_cudnn_policy
from studies import cudnn_flush_fit as fit
from studies.device.fresh_check import grid


def _recording(tmp_path, truth: frozenset[str]):
    cases = []
    bits = {}
    for i in (13, 23):  # 129 keys (two key blocks: the rescale shows), and 7 keys causal
        c = grid("sdpa_cudnn", i + 1, kinds=("subnormal",), dtype="bf16")[i] | {"heads": 2}
        c["policy"] = PolicyRef("gpu.policies:sdpa_cudnn_policy", {"dtype": "bf16", "head_dim": c["d"]}).to_json()
        c["launch"] = {}
        c["digests"] = {"o": "", "lse": ""}
        cases.append(c)
        emu = fit.forward_bits(c, fit.variant(sdpa_cudnn_policy("bf16", c["d"]), truth))
        bits |= {f"sdpa_cudnn/{c['seed']}/{k}": v for k, v in emu.items()}
    rec = tmp_path / "fresh_check.json"
    rec.write_text(json.dumps({"cases": cases}))
    np.savez(tmp_path / "fresh_bits_0.npz", **bits)
    return rec, tmp_path / "fresh_bits_0.npz"


def test_the_fit_names_the_steps_that_flush(tmp_path):
    truth = frozenset(fit.STEPS) - {"normalize"}
    rec, npz = _recording(tmp_path, truth)
    cases, gpu = fit.recorded(rec, [npz], max_keys=1100)
    ranked = fit.fit(cases, gpu, "single")
    assert ranked[0]["flushed"] == sorted(truth, key=fit.STEPS.index) and ranked[0]["launches"] == 2
    every = next(r for r in ranked if r["flushed"] == list(fit.STEPS))
    assert every["launches"] < 2 and every["same"]["o"] < every["total"]["o"]  # the policy as it is misses here
    tried = {tuple(sorted(f, key=fit.STEPS.index)) for f in fit.variants("single")}
    assert {tuple(r["flushed"]) for r in ranked} == tried


def test_the_command_prints_the_ranking_and_refuses_a_recording_without_bits(tmp_path, capsys):
    rec, npz = _recording(tmp_path, frozenset(fit.STEPS))
    assert fit.main([str(rec), "--bits", str(npz), "--max-keys", "10"]) == 0
    out = capsys.readouterr().out
    assert "1 cuDNN launches" in out and out.count("| 1 / 1 |") >= 1
    assert fit.main([str(rec)]) == 2
    assert "no cuDNN case" in capsys.readouterr().err
    assert fit.main([str(tmp_path / "none.json")]) == 2
    assert len(fit.variants("all")) == 2 ** len(fit.STEPS)


@pytest.mark.parametrize("bad", ["0", "-3"])
def test_max_keys_is_checked(tmp_path, capsys, bad):
    rec, npz = _recording(tmp_path, frozenset())
    assert fit.main([str(rec), "--bits", str(npz), "--max-keys", bad]) == 2
    assert "--max-keys" in capsys.readouterr().err
