"""Checks of the Triton kernels' logic under Triton's CPU interpreter; run by tests/gpu/test_kernels_interpreter.py.

The checks run with `TRITON_INTERPRET=1` (Triton reads it at import): one as
`python tests/gpu/interpreter_checks.py CHECK [args]`, which raises AssertionError on a failure and prints "ok",
or several in one process as `python tests/gpu/interpreter_checks.py --batch "CHECK ARGS" ...` (one RESULT line
each, what the tests run).
The interpreter is not the H100 (gpu/kernels/interpreter.py says how), so the checks are:

- `forward`: O and LSE of the tl forward kernel against FP64 attention within fp16 tolerances, on
  ragged shapes (keys and queries not multiples of the tiles), causal or not, every softmax variant;
- `shifts`: on integer-valued q and k, whose scores are exact in any summation order (so the
  interpreter's numpy dot and the H100's wgmma give the same scores), many of them tied, the running max m
  the kernel keeps after every K/V block (its debug output) equals, bit for bit, the m that flashsim's
  model of the kernel (`gpu.policies.kernel_policy`) computes: the tie counts, thresholds, the split
  rule and the shifts of the fixes, the causal and ragged masks and the block order all agree;
- `backward`: dQ, dK, dV of the backward kernels against FP64 autograd;
- `heads`: a batch split into several launches of consecutive heads (as beyond CUDA's 65535 grid rows,
  here with `flash.heads_per_launch(4)`) gives the bits of one launch: O, LSE, the debug outputs, dQ, dK, dV, delta;
- `empty`: no keys gives O = 0 and LSE = -inf (SDPA's convention) and dQ = 0; no queries dK = dV = 0;
- `arguments`: bad arguments raise errors that name them instead of being coerced (a string for a
  flag or a scale, a scale whose float32 rounding is 0 or Inf, backward's o / do / lse of another shape or
  dtype, another device), and a second derivative through `flash.attention` raises instead of being 0;
- `v_transposed`: V read transposed (FP8's layout, `v_transposed=True` for fp16) gives the bits of V as
  given;
- `causality`: under causal masking a row never sees a later key: not a score far above its own (the
  tutorial's -1e6 bias let it win), not a NaN (which made the earlier rows of its tile NaN).
"""

from __future__ import annotations

import math
import os
import re
import sys

import numpy as np

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import pytest  # noqa: E402
import torch  # noqa: E402

from gpu import flash  # noqa: E402
from gpu.crosscheck import bits_of, same_bits  # noqa: E402
from gpu.policies import kernel_policy, kernel_variant  # noqa: E402
from studies.device.run_attention import reference  # noqa: E402

SHAPES = [(100, 77, 64), (70, 300, 64), (129, 200, 128), (90, 150, 256)]  # (N_q, N_k, d): ragged against every tile


def _heads(shape, h: int, seed: int, integer: bool) -> tuple[torch.Tensor, ...]:
    n_q, n_k, d = shape
    rng = np.random.default_rng(seed)
    if integer:  # small integers: every score, partial sum and product is exact in float32
        draw = [rng.integers(-2, 3, (1, h, n, d)) for n in (n_q, n_k, n_k)]
        copies = rng.random(n_k) < 0.5  # half the keys repeat an earlier key: exact ties, in and across blocks
        copies[0] = False
        for j in np.flatnonzero(copies):
            draw[1][:, :, j] = draw[1][:, :, rng.integers(0, j)]
    else:
        draw = [rng.standard_normal((1, h, n, d)) for n in (n_q, n_k, n_k)]
    return tuple(torch.from_numpy(a.astype(np.float32)).to(torch.float16) for a in draw)


def check_forward(causal: bool, softmax: str) -> None:
    for i, shape in enumerate(SHAPES):
        q, k, v = _heads(shape, 2, 10 + i, integer=False)
        o, lse, _ = flash.forward(q, k, v, causal=causal, softmax=softmax, kernel="triton")
        o64, lse64, _ = reference(q, k, v, causal, 1 / math.sqrt(shape[2]))
        err_o = (o.double() - o64).abs().max().item()
        err_lse = (flash.lse_natural(lse).double() - lse64).abs().max().item()
        # fp16 O: half an ulp at |O| < 1 is 2^-12; P in fp16 and the fp32 sums add a few more
        assert err_o < 4e-3 and err_lse < 1e-4, (shape, causal, softmax, err_o, err_lse)


def check_shifts(causal: bool, softmax: str) -> None:
    from flashsim.stepper import step_rows

    for i, shape in enumerate(SHAPES):
        n_q, n_k, d = shape
        q, k, v = _heads(shape, 1, 20 + i, integer=True)
        _, _, dbg = flash.forward(q, k, v, causal=causal, softmax=softmax, kernel="triton", debug=True)
        got = dbg["m"][0].numpy()  # (blocks, N_q): m after each K/V block (NaN where a block was skipped)
        pol = kernel_policy("fp16", d, causal)
        block_m = flash.FWD_CONFIGS[(d, causal)].block_m
        qn, kn, vn = (x[0, 0].float().numpy() for x in (q, k, v))
        variant = kernel_variant(softmax, "fp16")
        compared = shifted = 0
        for start in range(0, n_q, block_m):
            rows = slice(start, min(start + block_m, n_q))
            plain = {
                st.block: np.asarray(st.m, np.float32).reshape(-1)
                for st in step_rows(qn, kn, vn, pol, rows=rows, causal=causal, trace=False)
            }
            for st in step_rows(qn, kn, vn, pol, rows=rows, softmax=variant, causal=causal, trace=False):
                want = np.asarray(st.m, np.float32).reshape(-1)
                have = got[st.block, rows]
                bad = np.flatnonzero(want.view(np.uint32) != have.view(np.uint32))
                assert not bad.size, (shape, causal, softmax, st.block, start + bad[0], want[bad[0]], have[bad[0]])
                compared += want.size
                shifted += int(np.count_nonzero(want != plain[st.block]))
        assert compared >= n_q, compared
        # the inputs exercise the fix: over a fifth of the (row, block) steps keep a shifted m
        assert shifted == 0 if softmax == "standard" else shifted > compared // 5, (shape, causal, softmax, shifted)


def check_backward(causal: bool) -> None:
    for i, shape in enumerate(SHAPES):
        q, k, v = _heads(shape, 2, 30 + i, integer=False)
        do = torch.randn(q.shape, generator=torch.Generator().manual_seed(i)).to(torch.float16)
        o, lse, _ = flash.forward(q, k, v, causal=causal, kernel="triton")
        got = flash.backward(q, k, v, o, lse, do, causal=causal)[:3]
        grads = reference(q, k, v, causal, 1 / math.sqrt(shape[2]), do)[2]
        for name, g, ref in zip(("dq", "dk", "dv"), got, grads, strict=True):
            rel = ((g.double() - ref).abs().max() / ref.abs().max()).item()
            assert rel < 1e-2, (shape, causal, name, rel)


def check_heads(causal: bool) -> None:
    q, k, v = (x.reshape(3, 2, *x.shape[2:]) for x in _heads((70, 77, 64), 6, 40, integer=False))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(torch.float16)
    runs = []
    for per_launch in (flash.HEADS_PER_LAUNCH, 4):  # 6 heads: one launch, then launches of 4 and 2
        with flash.heads_per_launch(per_launch):
            o, lse, dbg = flash.forward(q, k, v, causal=causal, softmax="robust", kernel="triton", debug=True)
            runs.append([o, lse, *dbg.values(), *flash.backward(q, k, v, o, lse, do, causal=causal)])
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(bits_of(a), bits_of(b)), causal


def check_empty(causal: bool) -> None:
    q, k = (torch.randn(1, 2, n, 64).to(torch.float16) for n in (5, 7))
    none = k[:, :, :0]
    o, lse, _ = flash.forward(q, none, none, causal=causal, kernel="triton")
    dq = flash.backward(q, none, none, o, lse, torch.randn_like(o), causal=causal)[0]
    assert not o.any() and bool((lse == float("-inf")).all()) and not dq.any()
    assert torch.equal(o, torch.nn.functional.scaled_dot_product_attention(q, none, none))
    o, lse, _ = flash.forward(none, k, k, causal=causal, kernel="triton")
    _, dk, dv, _ = flash.backward(none, k, k, o, lse, o, causal=causal)
    assert o.shape == none.shape and not dk.any() and not dv.any()


def _raises(error: type, match: str, fn, *args, **kwargs) -> None:
    """fn(*args, **kwargs) raises `error` with `match` (plain text, not a pattern) in its message."""
    with pytest.raises(error, match=re.escape(match)):
        fn(*args, **kwargs)


def check_arguments(causal: bool) -> None:
    q, k, v, do = (torch.randn(1, 2, 16, 64).to(torch.float16) for _ in range(4))
    fwd = flash.forward
    _raises(TypeError, "causal: expected a bool", fwd, q, k, v, causal="False")
    _raises(TypeError, "debug: expected a bool", fwd, q, k, v, debug=1)
    _raises(TypeError, "v_transposed: expected a bool", fwd, q, k, v, v_transposed="no")
    for bad in (0, 4.0, True, flash.HEADS_PER_LAUNCH + 1):
        _raises(ValueError, "heads_per_launch: expected an integer", flash.heads_per_launch(bad).__enter__)
    _raises(TypeError, "is_causal: expected a bool", flash.scaled_dot_product_attention, q, k, v, is_causal="no")
    for bad in ("0.125", True, torch.tensor(0.125)):
        _raises(TypeError, "sm_scale: expected a float", fwd, q, k, v, sm_scale=bad)
    for bad in (0.0, -0.125, float("nan"), float("inf"), 1e-50, 1e-40, 1e39):  # 1e-40: a subnormal float32
        _raises(ValueError, "sm_scale: expected a finite positive number", fwd, q, k, v, sm_scale=bad)
    _raises(ValueError, "scale: expected a finite positive", flash.scaled_dot_product_attention, q, k, v, scale=1e-50)
    _raises(TypeError, "softmax: expected a name", fwd, q, k, v, softmax=["standard"])
    _raises(TypeError, "config: expected a gpu.configs.Config or None", fwd, q, k, v, config=(64, 64, 4, 2))
    k128 = torch.randn(1, 2, 16, 128).to(torch.float16)
    _raises(ValueError, "k, v: head dim 128 differs from q's 64", fwd, q, k128, k128)
    sdpa = flash.scaled_dot_product_attention  # its errors name its own arguments
    _raises(ValueError, "key, value: head dim 128 differs from query's 64", sdpa, q, k128, k128)
    _raises(TypeError, "value: expected a torch.Tensor", sdpa, q, k, None)
    _raises(
        ValueError,
        "query, key, value: shapes (B, H, N, d) must agree (B, H, d; key and value equal)",
        sdpa,
        q,
        k[:, :1],
        v,
    )
    long = torch.zeros(1, 1, 1, 64, dtype=torch.float16).expand(1, 1, 2**25, 64)  # stride 0: no memory
    _raises(ValueError, "q: N * d = 2147483648; accepted: below 2^31", fwd, long, long, long)
    meta = torch.empty(1, 2, 16, 64, dtype=torch.float16, device="meta")
    _raises(ValueError, "q, k, v: on different devices", fwd, q, meta, meta)

    o, lse, _ = fwd(q, k, v, causal=causal)
    bwd = flash.backward
    for name, args in (
        ("lse", (o, lse[:, :, :8], do)),
        ("lse", (o, lse.half(), do)),
        ("lse", (o, lse.to(torch.float64), do)),
        ("do", (o, lse, do.float())),
        ("do", (o, lse, do.transpose(2, 3)[..., :16, :])),
        ("o", (o[:, :, :4], lse, do)),
    ):
        _raises(ValueError, f"{name}: ", bwd, q, k, v, *args, causal=causal)
    _raises(TypeError, "do: expected a torch.Tensor", bwd, q, k, v, o, lse, [1.0], causal=causal)
    _raises(TypeError, "config: expected a gpu.configs.Config", bwd, q, k, v, o, lse, do, config={"block_m": 64})
    _raises(ValueError, "sm_scale: expected a finite positive", bwd, q, k, v, o, lse, do, causal=causal, sm_scale=0)
    want = bwd(q, k, v, o, lse, do, causal=causal)  # accepted: the same call with good arguments
    got = bwd(q, k, v, o, lse, do.transpose(2, 3).contiguous().transpose(2, 3), causal=causal)  # strides are fine
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))

    qg = q.clone().requires_grad_()
    out = flash.attention(qg, k, v, causal=causal)
    (g,) = torch.autograd.grad(out.float().pow(2).sum(), qg, create_graph=True)
    _raises(RuntimeError, "once_differentiable", g.float().pow(2).sum().backward)


def check_v_transposed(causal: bool) -> None:
    """V read transposed (as FP8's is, here forced for fp16) gives the bits of V as given: O, LSE and every
    debug output, on ragged shapes (the transposed rows padded to 16 keys, the padding never read)."""
    for i, shape in enumerate(SHAPES):
        q, k, v = _heads(shape, 2, 60 + i, integer=False)
        runs = []
        for v_transposed in (False, True):
            o, lse, dbg = flash.forward(
                q, k, v, causal=causal, softmax="robust", kernel="triton", debug=True, v_transposed=v_transposed
            )
            runs.append([o, lse, *dbg.values()])
        assert same_bits(*runs), (shape, causal)


def check_causality(causal: bool) -> None:
    for d in (64, 256):  # d=256: 128-row tiles over 64-key blocks, so rows with every key of a block masked
        q, k, v = (torch.zeros(1, 1, 2, d, dtype=torch.float16) for _ in range(3))
        q[0, 0, 0], k[0, 0, 0], v[0, 0, 1] = -300.0, 300.0, 1.0  # row 0's only key scores -1.04e6 (log2 units)
        for softmax in ("standard", "stabilised", "robust"):
            o = flash.forward(q, k, v, causal=True, softmax=softmax, kernel="triton")[0]
            assert o[0, 0, 0, 0] == 0.0, (d, softmax, o[0, 0, 0, 0])  # v of key 0, not of the masked key 1
        q, k, v = _heads((80, 80, d), 1, 50, integer=False)
        for softmax in ("standard", "stabilised", "robust"):
            want = flash.forward(q, k, v, causal=True, softmax=softmax, kernel="triton")
            bad = k.clone()
            bad[0, 0, 10, 0] = float("nan")
            got = flash.forward(q, bad, v, causal=True, softmax=softmax, kernel="triton")
            assert torch.equal(got[0][:, :, :10], want[0][:, :, :10]), (d, softmax)
            assert torch.equal(got[1][:, :, :10], want[1][:, :, :10]), (d, softmax)
            assert torch.isnan(got[0][:, :, 10:]).all(), (d, softmax)


def run_check(argv: list[str]) -> None:
    """One check: `argv` = [CHECK, 'full' or 'causal', softmax if the check takes one]."""
    check, *args = argv
    causal = args[0] == "causal"
    if check == "forward":
        check_forward(causal, args[1])
    elif check == "shifts":
        check_shifts(causal, args[1])
    elif check == "backward":
        check_backward(causal)
    elif check == "heads":
        check_heads(causal)
    elif check == "empty":
        check_empty(causal)
    elif check == "arguments":
        check_arguments(causal)
    elif check == "causality":
        check_causality(causal)
    elif check == "v_transposed":
        check_v_transposed(causal)
    else:
        raise SystemExit(
            f"unknown check {check!r}; accepted: forward, shifts, backward, heads, empty, arguments, "
            "causality, v_transposed"
        )


def main(argv: list[str]) -> None:
    """`CHECK ARGS...`: one check, then "ok".  `--batch "CHECK ARGS" ...`: each check in turn in this one
    process (the interpreter's start-up paid once), a line "RESULT <check args>: ok" or "RESULT <check args>:
    FAIL" followed by its traceback for each, then "done"."""
    if argv[:1] != ["--batch"]:
        run_check(argv)
        print("ok")
        return
    import traceback

    for spec in argv[1:]:
        try:
            run_check(spec.split())
            print(f"RESULT {spec}: ok", flush=True)
        except Exception:  # noqa: BLE001 - every check reports; the test of that check fails with this
            print(f"RESULT {spec}: FAIL\n{traceback.format_exc()}", flush=True)
    print("done")


if __name__ == "__main__":
    main(sys.argv[1:])
