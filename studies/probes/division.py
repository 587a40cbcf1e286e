"""Probe 2: fp32 `a / b` in a Triton kernel against IEEE division and candidate models.

The real operation is `a / b` in its own kernel (Triton lowers it to div.full.f32; the PTX and SASS are kept).
Candidates, each in its own kernel (inline PTX where Triton has no operation for it):

- `div_rn`: tl.math.div_rn (IEEE, div.rn.f32); also torch's float32 division (IEEE) as a cross-check;
- `asm_div_full`, `asm_div_full_ftz`, `asm_div_approx`, `asm_div_approx_ftz`: the PTX instructions;
- `rcp_ftz_mul`: a * rcp.approx.ftz.f32(b); `rcp_mul`: a * rcp.approx.f32(b);
- `rcp_ftz_newton_mul`: r1 = fma(r, fma(-b, r, 1), r), a * r1 (one Newton step on the reciprocal);
- `rcp_ftz_qrefine`: q0 = a*r, q1 = fma(r, fma(-b, q0, a), q0) (one correction of the quotient);
- `scaled_rcp_ftz_mul`: s = 0.25 if |b| > 2**126, 2**24 if b is subnormal, else 1; (a*s) * rcp.approx.ftz(b*s)
  (what ptxas makes of div.full.f32 for sm_90, read from the SASS of an offline compile).

Populations (made on the GPU from a recorded seed): `random` (uniform over the finite non-zero bit patterns)
and `exp10` (random sign and mantissa, exponents in [-10, 10]); plus a fixed set of special and boundary pairs.
Per population: the ulp-difference histogram of `/` against IEEE, per result category, and how many outputs of
each candidate agree bit for bit with `/`.
"""

from __future__ import annotations

import re
import time

import numpy as np
import torch
import triton
import triton.language as tl

from . import torchutil as tu
from .common import Hist, hexbits
from .inputs import special_pairs

BLOCK = 1024
MODELS = (
    "div",
    "div_rn",
    "asm_div_full",
    "asm_div_full_ftz",
    "asm_div_approx",
    "asm_div_approx_ftz",
    "rcp_ftz_mul",
    "rcp_mul",
    "rcp_ftz_newton_mul",
    "rcp_ftz_qrefine",
    "scaled_rcp_ftz_mul",
)
CATEGORIES = ("normal", "b_subnormal", "b_huge", "q_overflow", "q_underflow", "a_subnormal", "special")


@triton.jit
def _rcp_ftz(x):
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _div_model_kernel(a_ptr, b_ptr, q_ptr, n, MODEL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=1.0)
    b = tl.load(b_ptr + offs, mask=m, other=1.0)
    if MODEL == 0:
        q = a / b
    elif MODEL == 1:
        q = tl.math.div_rn(a, b)
    elif MODEL == 2:
        q = tl.inline_asm_elementwise(
            "div.full.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    elif MODEL == 3:
        q = tl.inline_asm_elementwise(
            "div.full.ftz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    elif MODEL == 4:
        q = tl.inline_asm_elementwise(
            "div.approx.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    elif MODEL == 5:
        q = tl.inline_asm_elementwise(
            "div.approx.ftz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    elif MODEL == 6:
        q = a * _rcp_ftz(b)
    elif MODEL == 7:
        r = tl.inline_asm_elementwise("rcp.approx.f32 $0, $1;", "=f,f", [b], dtype=tl.float32, is_pure=True, pack=1)
        q = a * r
    elif MODEL == 8:
        r = _rcp_ftz(b)
        e = tl.fma(-b, r, 1.0)
        r1 = tl.fma(r, e, r)
        q = a * r1
    elif MODEL == 9:
        r = _rcp_ftz(b)
        q0 = a * r
        res = tl.fma(-b, q0, a)
        q = tl.fma(r, res, q0)
    else:
        # the SASS of div.full.f32 on sm_90: scale both operands by 1/4 when |b| > 2**126 and by 2**24 when b
        # is subnormal, then a' * MUFU.RCP(b')
        s = tl.where(tl.abs(b) > 8.507059173023462e37, 0.25, 1.0)
        s = tl.where(tl.abs(b) < 1.1754943508222875e-38, 16777216.0, s)
        q = (a * s) * _rcp_ftz(b * s)
    tl.store(q_ptr + offs, q, mask=m)


class TritonDivBackend:
    def __init__(self) -> None:
        self.evidence: dict = {}
        self.failed: dict = {}
        self.sass_div: str | None = None

    def run(self, model: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        """Quotients of one model, or None when its kernel does not compile."""
        if model == "torch":
            return a / b
        if model in self.failed:
            return None
        mid = MODELS.index(model)
        q = torch.empty_like(a)
        n = a.numel()
        try:
            k = _div_model_kernel[(triton.cdiv(n, BLOCK),)](a, b, q, n, MODEL=mid, BLOCK=BLOCK)
        except Exception as e:  # noqa: BLE001
            self.failed[model] = repr(e)[:500]
            return None
        if model not in self.evidence:
            self.evidence[model] = tu.kernel_evidence(k)
            if model == "div":
                self.sass_div = tu.sass_text(k)
        return q


# ----------------------------------------------------------------------------------------------------------
def gen_population(kind: str, n: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    def one():
        r = torch.randint(0, 2**32, (n,), generator=gen, device=device, dtype=torch.int64)
        sign = (r >> 31) & 1
        mant = r & 0x7FFFFF
        if kind == "random":
            e = torch.randint(0, 255, (n,), generator=gen, device=device, dtype=torch.int64)
        else:
            e = torch.randint(127 - 10, 127 + 11, (n,), generator=gen, device=device, dtype=torch.int64)
        mant = torch.where((e == 0) & (mant == 0), torch.ones_like(mant), mant)
        return tu.bits_to_f32((sign << 31) | (e << 23) | mant)

    return one(), one()


def categories(a: torch.Tensor, b: torch.Tensor, q_rn: torch.Tensor) -> torch.Tensor:
    """Category index per pair (CATEGORIES), first match wins in this order: special (nan/inf/zero input),
    b subnormal, |b| > 2**126, IEEE result overflows, IEEE result below 2**-126, a subnormal, normal."""
    tiny = 2.0**-126
    cat = torch.zeros(a.shape, dtype=torch.int8, device=a.device)
    rules = [
        (CATEGORIES.index("a_subnormal"), (a != 0) & (a.abs() < tiny)),
        (CATEGORIES.index("q_underflow"), q_rn.abs() < tiny),
        (CATEGORIES.index("q_overflow"), torch.isinf(q_rn)),
        (CATEGORIES.index("b_huge"), b.abs() > 2.0**126),
        (CATEGORIES.index("b_subnormal"), (b != 0) & (b.abs() < tiny)),
        (
            CATEGORIES.index("special"),
            ~torch.isfinite(a) | ~torch.isfinite(b) | (a == 0) | (b == 0),
        ),
    ]
    for idx, m in rules:  # later rules override earlier ones
        cat = torch.where(m, torch.full_like(cat, idx), cat)
    return cat


def _eq(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) == y.view(torch.int32)) | (torch.isnan(x) & torch.isnan(y))


class PopStats:
    def __init__(self) -> None:
        self.n = 0
        self.hist = {c: Hist(clip=64) for c in CATEGORIES}
        self.hist_all = Hist(clip=64)
        self.other = {"div_nan_rn_not": 0, "sign_or_class_differs": 0}
        self.agree = {m: np.zeros((len(CATEGORIES), 2), dtype=np.int64) for m in MODELS + ("torch",)}
        self.model_vs_div_hist = {m: Hist(clip=16) for m in MODELS + ("torch",)}
        self.torch_vs_rn_mismatch = 0
        self.first_disagreements: list = []


def analyze(outs: dict, a, b, st: PopStats, keep_first: int = 16) -> torch.Tensor:
    q = outs["div"]
    rn = outs["div_rn"]
    cat = categories(a, b, rn).to(torch.int64)
    st.n += a.numel()
    fin = torch.isfinite(q) & torch.isfinite(rn)
    same = torch.signbit(q) == torch.signbit(rn)
    d = q.view(torch.int32).to(torch.int64) - rn.view(torch.int32).to(torch.int64)
    ok = fin & same
    tu.hist_add(st.hist_all, d, ok)
    for ci, c in enumerate(CATEGORIES):
        tu.hist_add(st.hist[c], d, ok & (cat == ci))
    st.other["div_nan_rn_not"] += int((torch.isnan(q) & ~torch.isnan(rn)).sum())
    st.other["sign_or_class_differs"] += int((~ok & ~_eq(q, rn)).sum())
    ncat = len(CATEGORIES)
    tot = torch.bincount(cat, minlength=ncat).cpu().numpy()
    for m, o in outs.items():
        if o is None:
            continue
        eq = _eq(o, q)
        agree = torch.bincount(cat[eq], minlength=ncat).cpu().numpy()
        st.agree[m][:, 0] += agree
        st.agree[m][:, 1] += tot
        dm = o.view(torch.int32).to(torch.int64) - q.view(torch.int32).to(torch.int64)
        okm = torch.isfinite(o) & torch.isfinite(q) & (torch.signbit(o) == torch.signbit(q))
        tu.hist_add(st.model_vs_div_hist[m], dm, okm)
    if "torch" in outs and outs["torch"] is not None:
        st.torch_vs_rn_mismatch += int((~_eq(outs["torch"], rn)).sum())
    dis = ~_eq(q, rn)
    if len(st.first_disagreements) < keep_first and bool(dis.any()):
        for i in tu.first_true(dis, keep_first - len(st.first_disagreements)).tolist():
            st.first_disagreements.append(
                {
                    "a": hexbits(int(tu.u32(a[i : i + 1])[0])),
                    "b": hexbits(int(tu.u32(b[i : i + 1])[0])),
                    "div": hexbits(int(tu.u32(q[i : i + 1])[0])),
                    "div_rn": hexbits(int(tu.u32(rn[i : i + 1])[0])),
                    "category": CATEGORIES[int(cat[i])],
                }
            )
    return dis


def pop_json(st: PopStats) -> dict:
    return {
        "pairs": st.n,
        "hist_div_minus_ieee_all": st.hist_all.to_json(),
        "hist_div_minus_ieee_by_category": {c: h.to_json() for c, h in st.hist.items()},
        "other": st.other,
        "agreement_with_div": {
            m: {c: [int(v[i, 0]), int(v[i, 1])] for i, c in enumerate(CATEGORIES) if v[i, 1]}
            | {"all": [int(v[:, 0].sum()), int(v[:, 1].sum())]}
            for m, v in st.agree.items()
            if v[:, 1].sum()
        },
        "hist_model_minus_div": {m: h.to_json() for m, h in st.model_vs_div_hist.items() if h.total},
        "torch_vs_div_rn_mismatch": st.torch_vs_rn_mismatch,
        "first_disagreements_div_vs_ieee": st.first_disagreements,
    }


def run_all_models(be, a, b) -> dict:
    outs = {m: be.run(m, a, b) for m in MODELS}
    outs["torch"] = be.run("torch", a, b)
    if outs["div"] is None or outs["div_rn"] is None:
        raise RuntimeError(f"div or div_rn kernel failed: {getattr(be, 'failed', {})}")
    return outs


def run(ctx) -> dict:
    dev = ctx.device
    be = ctx.backend or TritonDivBackend()
    params = getattr(ctx, "params", {}) or {}
    chunk = params.get("div_chunk", (1 << 16) if ctx.quick else (1 << 26))
    nchunks = params.get("div_chunks", 2 if ctx.quick else 16)
    seed = ctx.seed
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    result: dict = {"seed": seed, "generator": f"torch.Generator(device={dev!r}).manual_seed(seed), torch.randint"}
    # samples for the npz
    sample_per_pop = params.get("div_samples_per_pop", 2000 if ctx.quick else 40000)
    sample_dis = params.get("div_samples_disagree", 1000 if ctx.quick else 20000)
    samples: dict = {"a": [], "b": [], "source": [], **{f"out_{m}": [] for m in MODELS + ("torch",)}}

    def take(idx, a, b, outs, src):
        if idx.numel() == 0:
            return
        samples["a"].append(tu.to_numpy_u32(a[idx]))
        samples["b"].append(tu.to_numpy_u32(b[idx]))
        samples["source"].append(np.full(idx.numel(), src, dtype=np.uint8))
        for m in MODELS + ("torch",):
            o = outs.get(m)
            samples[f"out_{m}"].append(
                tu.to_numpy_u32(o[idx]) if o is not None else np.zeros(idx.numel(), dtype=np.uint32)
            )

    pops = {}
    n_dis = 0
    for pi, kind in enumerate(("random", "exp10")):
        st = PopStats()
        t0 = time.monotonic()
        for c in range(nchunks):
            if ctx.time_left() < 15:
                ctx.log(f"division: {kind}: stopping after {c} chunks (time budget)")
                break
            a, b = gen_population(kind, chunk, gen, dev)
            outs = run_all_models(be, a, b)
            dis = analyze(outs, a, b, st)
            if c == 0:
                take(torch.arange(min(sample_per_pop, chunk), device=dev), a, b, outs, pi + 1)
            if n_dis < sample_dis:
                idx = tu.first_true(dis, sample_dis - n_dis)
                take(idx, a, b, outs, 10 + pi + 1)
                n_dis += idx.numel()
            del outs
        pops[kind] = pop_json(st)
        ctx.log(f"division: {kind}: {st.n} pairs in {time.monotonic() - t0:.1f}s")
        ctx.checkpoint({"partial": True, "populations": pops})
    # specials
    sa, sb, tags = special_pairs()
    a = torch.from_numpy(sa).to(dev)
    b = torch.from_numpy(sb).to(dev)
    outs = run_all_models(be, a, b)
    st = PopStats()
    analyze(outs, a, b, st, keep_first=64)
    pops["special"] = pop_json(st)
    take(torch.arange(a.numel(), device=dev), a, b, outs, 4)
    tag_names = sorted(set(tags))
    arrays = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.uint32) for k, v in samples.items()}
    arrays["special_tag"] = np.array([tag_names.index(t) for t in tags], dtype=np.uint8)
    arrays["special_tag_names"] = np.array(tag_names)
    np.savez_compressed(ctx.out / "division.npz", **arrays)
    result["populations"] = pops
    result["models"] = list(MODELS) + ["torch"]
    result["categories"] = list(CATEGORIES)
    result["evidence"] = getattr(be, "evidence", {})
    result["sass_div_kernel"] = _sass_excerpt(getattr(be, "sass_div", None))
    result["failed_models"] = getattr(be, "failed", {})
    result["npz"] = "division.npz"
    result["npz_source_codes"] = {
        "1": "first pairs of population random",
        "2": "first pairs of population exp10",
        "11": "disagreements div vs div_rn, random",
        "12": "disagreements div vs div_rn, exp10",
        "4": "special pairs (tag in special_tag, same order)",
    }
    # summary
    r = pops.get("random", {})
    agree = r.get("agreement_with_div", {})
    best = sorted(((v["all"][0] / max(v["all"][1], 1), m) for m, v in agree.items() if m != "div"), reverse=True)[:3]
    ev_div = result["evidence"].get("div", {}).get("ptx", {}).get("mnemonics", {})
    result["summary"] = {
        "div_ptx": ",".join(k for k in ev_div if k.startswith(("div", "rcp"))) or "n/a",
        "div_eq_ieee_random": _share(r.get("hist_div_minus_ieee_all")),
        "best_models_random": ", ".join(f"{m} {f:.6%}" for f, m in best),
    }
    return result


def _share(h: dict | None) -> str:
    if not h or not h.get("total"):
        return "n/a"
    return f"{h['bins'].get('0', 0) / h['total']:.6%}"


_SASS_CTRL = re.compile(r"^[-\w]{2}:[-\w]:[-\w]:[-\w]:[-\w]+\s+")


def _sass_excerpt(sass: str | None, max_lines: int = 200) -> list[str] | None:
    """The instruction lines of a SASS listing without addresses, control codes, encodings and NOPs. Handles
    cuobjdump style ("/*0090*/ MUFU.RCP R5, R0 ; /* 0x... */") and nvdisasm style ("--:-:1:-:2\tMUFU.RCP ...")."""
    if not sass:
        return None
    out = []
    for ln in sass.splitlines():
        t = ln.strip()
        if not t:
            continue
        if t.startswith("/*"):
            if "*/" not in t:
                continue
            t = t.split("*/", 1)[1].split("/*", 1)[0].strip()
        else:
            t = _SASS_CTRL.sub("", t)
        if not t or t.startswith("NOP") or t.startswith("."):
            continue
        out.append(t)
    return out[:max_lines]
