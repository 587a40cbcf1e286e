"""Single-element probes of tl.dot and their interpretation, plus the random stress tiles (numpy only).

A *case* is one dot product of length K with a few non-zero products (and maybe an accumulator C). All 64x64
outputs of a tile hold the same dot product (every row of A and every column of B is the case's vector), so
the GPU side also checks that the arithmetic does not depend on the output position.

Values are *relative*: a product of relative value r is realised as a*b = r * U with U = 2**fmt.unit_exp and
a, b exact values of the input format (so fp8, whose normals span few binades, can still hold 1 and 2**-20
as products of normal numbers). Results are divided by U before they are interpreted. Cases marked
`absolute` (the tiny-value probes) are not scaled.

The probe runs in rounds (each round's cases depend on what the previous round found):
1. `survival`: C = 1 and one product +-2**-n: the output precision p (largest n that survives).
2. `pair_carry` (block partition and its order), `pair_small` (do sub-ulp parts of two products in one
   block add up?), `align_*` (fraction bits kept when aligning to the largest exponent, per position,
   small term as a product or as C), `round_*` (final rounding mode), `tiny_*` (exponent floor,
   subnormal products), `cpass` (is C passed through exactly?), `special` (inf, NaN, overflow, -0).
3. `zero_*`: do zero products with a huge other factor take part in the maximum exponent?
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

import emufloat as ef
from emufloat.hw import h100

from .common import bits_f32, f32_bits, hexbits
from .formats import Fmt, encode_array, encode_exact, product_factors, random_finite_bits, round_to_fmt

F32_MIN_SUB = 2.0**-149
ROUNDING_MODES = ("rz", "rne", "rna", "ru", "rd")  # the final roundings the probes tell apart, by their names
EF_ROUNDING = {"rz": "rtz", "rne": "rne", "rna": "rna", "ru": "rup", "rd": "rdown"}  # the same in emufloat
# the published tensor-core models, as emufloat presets (fp8: the default tl.dot, no promotion)
PUBLISHED = {
    "bf16": h100.WGMMA_BF16, "fp16": h100.WGMMA_FP16, "e4m3": h100.WGMMA_FP8, "e5m2": h100.WGMMA_FP8,
}  # fmt: skip


def block_model(
    block: int,
    frac_bits: int,
    out_frac_bits: int,
    rounding: str,
    zero_products_in_max: bool = False,
    name: str = "fitted",
) -> ef.FusedBlock:
    """The emufloat tensor-core model (`emufloat.FusedBlock`) with the parameters the probes fit.

    `block` products per fused step (`width`), `frac_bits` kept below the largest exponent when aligning
    (`align_bits`), the step's sum rounded in mode `rounding` (one of `ROUNDING_MODES`) to a float32 with
    `out_frac_bits` fraction bits (`acc_fmt`; 23 is FP32 itself), zero products in the maximum exponent or
    not (`zeros_in_max`). Everything else is FusedBlock's: C (each step's addend: the accumulator, then the
    previous step's result) takes part in the step's alignment, at emin when subnormal; a sum truncated to zero
    is +0; a step beyond the float32 range gives inf, even under RZ.
    """
    if rounding not in EF_ROUNDING:
        raise ValueError(f"rounding: expected one of {ROUNDING_MODES}, got {rounding!r}")
    if not 1 <= out_frac_bits <= 23:
        raise ValueError(f"out_frac_bits: the result is a float32, so 1 to 23 fraction bits, got {out_frac_bits}")
    acc = ef.FP32 if out_frac_bits == 23 else ef.Format(8, out_frac_bits, name=f"fp32_{out_frac_bits}")
    return ef.FusedBlock(
        width=block,
        align_bits=frac_bits,
        final_rounding=ef.Rounding(EF_ROUNDING[rounding]),
        acc_fmt=acc,
        zeros_in_max=bool(zero_products_in_max),
        name=name,
    )


def fitted_model(concl: dict) -> ef.FusedBlock | None:
    """The FusedBlock of `probe_format`'s fitted `model` (None where a parameter was inconclusive); raises
    ValueError for parameters FusedBlock cannot take."""
    m = concl.get("model", {})
    if not all(m.get(k) for k in ("block", "frac_bits", "out_frac_bits", "rounding")):
        return None
    return block_model(
        m["block"], m["frac_bits"], m["out_frac_bits"], m["rounding"], bool(m.get("zero_products_affect_alignment"))
    )


def model_params(model: ef.FusedBlock) -> dict:
    """The FusedBlock's parameters as JSON-able values (what a model comparison records)."""
    return {
        "name": model.name, "width": model.width, "align_bits": model.align_bits,
        "final_rounding": str(model.final_rounding), "acc_fmt": model.acc_fmt.name,
        "acc_frac_bits": model.acc_fmt.man_bits, "early_c": model.early_c, "zeros_in_max": model.zeros_in_max,
        "chunk": model.chunk, "inf_on_overflow": model.inf_on_overflow,
    }  # fmt: skip


@dataclass
class Case:
    group: str
    name: str
    prods: list  # (k, rel_value) or (k, ("abs", a_value, b_value))
    c: float | None = None  # accumulator (relative unless absolute); None: tl.dot(a, b) without acc
    absolute: bool = False
    info: dict = field(default_factory=dict)


@dataclass
class Built:
    a_bits: np.ndarray  # [T, K] fmt.uint
    b_bits: np.ndarray  # [T, K] fmt.uint (column of B, i.e. row of B^T)
    c_bits: np.ndarray  # [T] uint32 (0 where no C)
    has_c: np.ndarray  # [T] bool
    ok: np.ndarray  # [T] bool: representable
    exact: list  # [T] Fraction | None: exact sum (absolute)
    reason: list  # [T] str


def build_cases(cases: list[Case], fmt: Fmt, K: int) -> Built:
    T = len(cases)
    a_bits = np.zeros((T, K), dtype=np.int64)
    b_bits = np.zeros((T, K), dtype=np.int64)
    c_bits = np.zeros(T, dtype=np.uint32)
    has_c = np.zeros(T, dtype=bool)
    ok = np.ones(T, dtype=bool)
    exact: list = [None] * T
    reason = [""] * T
    U = 2.0**fmt.unit_exp
    for t, cs in enumerate(cases):
        scale = 1.0 if cs.absolute else U
        total = Fraction(0)
        try:
            for k, v in cs.prods:
                if not 0 <= k < K:
                    raise ValueError(f"position {k} outside K={K}")
                if isinstance(v, tuple):
                    _, av, bv = v
                else:
                    fac = product_factors(v * scale, fmt)
                    if fac is None:
                        raise ValueError(f"{v}*{scale} is no product of two {fmt.name} values")
                    av, bv = fac
                ab = encode_exact(av, fmt) if math.isfinite(av) else _encode_special(av, fmt)
                bb = encode_exact(bv, fmt) if math.isfinite(bv) else _encode_special(bv, fmt)
                if ab is None or bb is None:
                    raise ValueError(f"factor {av} or {bv} not exact in {fmt.name}")
                if a_bits[t, k] != 0 or b_bits[t, k] != 0:
                    raise ValueError(f"position {k} used twice")
                a_bits[t, k], b_bits[t, k] = ab, bb
                if math.isfinite(av) and math.isfinite(bv):
                    total += Fraction(av) * Fraction(bv)
            if cs.c is not None:
                cv = cs.c * scale
                if bits_f32(f32_bits(cv)) != cv and not (math.isnan(cv) and math.isnan(bits_f32(f32_bits(cv)))):
                    raise ValueError(f"C={cv} not exact in float32")
                c_bits[t] = f32_bits(cv)
                has_c[t] = True
                if math.isfinite(cv):
                    total += Fraction(cv)
            exact[t] = total
        except ValueError as e:
            ok[t] = False
            reason[t] = str(e)
            a_bits[t] = 0
            b_bits[t] = 0
            has_c[t] = cs.c is not None
    return Built(a_bits.astype(fmt.uint), b_bits.astype(fmt.uint), c_bits, has_c, ok, exact, reason)


DotFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], "tuple[np.ndarray, np.ndarray]"]


def run_cases(cases: list[Case], fmt: Fmt, K: int, dot_fn: DotFn) -> dict:
    """Build the cases and run them through `dot_fn(a_bits, b_bits, c_bits_or_None) -> (out_bits, uniform)`
    (called once for the cases without C and once for those with C). Returns a dict of arrays + the cases."""
    built = build_cases(cases, fmt, K)
    T = len(cases)
    out = np.zeros(T, dtype=np.uint32)
    uniform = np.ones(T, dtype=bool)
    for with_c in (False, True):
        idx = np.nonzero((built.has_c == with_c) & built.ok)[0]
        if idx.size == 0:
            continue
        o, u = dot_fn(built.a_bits[idx], built.b_bits[idx], built.c_bits[idx] if with_c else None)
        out[idx] = np.asarray(o, dtype=np.uint32)
        uniform[idx] = np.asarray(u, dtype=bool)
    return {"cases": cases, "built": built, "out": out, "uniform": uniform, "fmt": fmt, "K": K}


def rel_results(run: dict) -> np.ndarray:
    """Results divided by U (absolute cases unscaled), float64."""
    U = 2.0 ** run["fmt"].unit_exp
    vals = run["out"].view(np.float32).astype(np.float64)
    scale = np.array([1.0 if c.absolute else U for c in run["cases"]])
    return vals / scale


def _index(run: dict) -> dict:
    return {(c.group, c.name): i for i, c in enumerate(run["cases"])}


# ----------------------------------------------------------------------------------------------------------
# Round 1: output precision
# ----------------------------------------------------------------------------------------------------------
def survival_cases(K: int, nmax: int = 40) -> list[Case]:
    cases = []
    for n in range(1, nmax + 1):
        s = 2.0**-n
        cases.append(Case("survival", f"c_pos_n{n}", [(1, s)], c=1.0, info={"n": n}))
        cases.append(Case("survival", f"c_neg_n{n}", [(1, -s)], c=1.0, info={"n": n}))
        cases.append(Case("survival", f"noc_pos_n{n}", [(0, 1.0), (1, s)], info={"n": n}))
        cases.append(Case("survival", f"noc_neg_n{n}", [(0, 1.0), (1, -s)], info={"n": n}))
    return cases


def conclude_survival(run: dict) -> dict:
    r = rel_results(run)
    ok = run["built"].ok
    res: dict = {}
    for variant in ("c_pos", "c_neg", "noc_pos", "noc_neg"):
        surv = []
        tested = []
        for i, c in enumerate(run["cases"]):
            if c.group == "survival" and c.name.startswith(variant + "_") and ok[i]:
                tested.append(c.info["n"])
                if r[i] != 1.0:
                    surv.append(c.info["n"])
        res[variant] = {"tested_n": tested, "survived_n": surv, "max_n": max(surv) if surv else None}
    p = res["c_pos"]["max_n"] or res["noc_pos"]["max_n"]
    res["output_frac_bits"] = p
    res["monotone"] = all(
        sorted(v["survived_n"]) == list(range(min(v["survived_n"]), max(v["survived_n"]) + 1))
        for v in res.values()
        if isinstance(v, dict) and v.get("survived_n")
    )
    res["note"] = (
        "output_frac_bits = largest n for which C=1 plus a product 2**-n gives a result != 1: the number of "
        "fraction bits the result keeps at 1 (23 = full float32)."
    )
    return res


# ----------------------------------------------------------------------------------------------------------
# Round 2
# ----------------------------------------------------------------------------------------------------------
def pair_carry_cases(K: int, p: int) -> list[Case]:
    """C = 1 + u, +1 at i, -1 at j (u = 2**-p): the result is 1 exactly when i's block comes strictly before
    j's block (1 + u + 1 rounds to 2 at the block boundary), 1 + u otherwise."""
    u = 2.0**-p
    return [
        Case("pair_carry", f"i{i}_j{j}", [(i, 1.0), (j, -1.0)], c=1.0 + u, info={"i": i, "j": j})
        for i in range(K)
        for j in range(K)
        if i != j
    ]


def pair_small_cases(K: int, p: int) -> list[Case]:
    """C = 1, +2**-(p+1) at i and at j: 1 + 2**-p when the two sub-ulp parts add before rounding."""
    s = 2.0 ** -(p + 1)
    return [
        Case("pair_small", f"i{i}_j{j}", [(i, s), (j, s)], c=1.0, info={"i": i, "j": j})
        for i in range(K)
        for j in range(i + 1, K)
    ]


def infer_blocks(before: np.ndarray) -> dict:
    """Blocks of positions from the relation before[i, j] (i's block strictly precedes j's).

    Positions i, j share a block when neither precedes the other. Returns the blocks in processing order and
    a consistency report (an equivalence relation, a strict total order between blocks)."""
    K = before.shape[0]
    same = ~before & ~before.T
    np.fill_diagonal(same, True)
    parent = list(range(K))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(K):
        for j in range(i + 1, K):
            if same[i, j]:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(K):
        groups.setdefault(find(i), []).append(i)
    blocks = list(groups.values())
    problems = []
    label = np.empty(K, dtype=np.int64)
    for bi, blk in enumerate(blocks):
        label[blk] = bi
    for i in range(K):
        for j in range(K):
            if i == j:
                continue
            sb = label[i] == label[j]
            if sb and (before[i, j] or not same[i, j]):
                problems.append(f"{i},{j} in one block but not 'same'")
            if not sb and before[i, j] == before[j, i]:
                problems.append(f"{i},{j} in different blocks but order {bool(before[i, j])}/{bool(before[j, i])}")
            if len(problems) > 20:
                break
    # order blocks: a block's rank = number of blocks it precedes (descending)
    nb = len(blocks)
    prec = np.zeros((nb, nb), dtype=bool)
    for x in range(nb):
        for y in range(nb):
            if x != y:
                prec[x, y] = bool(before[blocks[x][0], blocks[y][0]])
    order = sorted(range(nb), key=lambda x: -int(prec[x].sum()))
    ordered = [sorted(blocks[x]) for x in order]
    for a_i in range(nb):
        for b_i in range(a_i + 1, nb):
            if not prec[order[a_i], order[b_i]]:
                problems.append(f"block order not total between blocks {a_i} and {b_i}")
    contiguous = all(b == list(range(b[0], b[-1] + 1)) for b in ordered)
    sizes = [len(b) for b in ordered]
    return {
        "blocks": ordered,
        "ranges": [[b[0], b[-1]] for b in ordered] if contiguous else None,
        "block_sizes": sizes,
        "contiguous": contiguous,
        "increasing_k": contiguous and all(ordered[i][-1] < ordered[i + 1][0] for i in range(nb - 1)),
        "consistent": not problems,
        "problems": problems[:20],
    }


def align_cases(K: int, p: int, n_lo: int, n_hi: int) -> list[Case]:
    cases = []
    for n in range(n_lo, n_hi + 1):
        s = 2.0**-n
        for r in range(1, K):
            cases.append(Case("align_prod_noc", f"n{n}_r{r}", [(0, 1.0), (r, -s)], info={"n": n, "pos": r}))
            cases.append(Case("align_prod_c0", f"n{n}_r{r}", [(0, 1.0), (r, -s)], c=0.0, info={"n": n, "pos": r}))
        for r in range(K):
            cases.append(Case("align_cbig", f"n{n}_r{r}", [(r, -s)], c=1.0, info={"n": n, "pos": r}))
            cases.append(Case("align_csmall", f"n{n}_q{r}", [(r, 1.0)], c=-s, info={"n": n, "pos": r}))
    return cases


def conclude_align(run: dict, blocks: list | None) -> dict:
    """For each align group: per n the positions where 1 - 2**-n differs from 1; the largest n that survives
    in the big term's block (fraction bits kept when aligning) and in each later block."""
    r = rel_results(run)
    ok = run["built"].ok
    K = run["K"]
    label = _block_labels(blocks, K)
    out = {}
    for g in ("align_prod_noc", "align_prod_c0", "align_cbig", "align_csmall"):
        per_n: dict[int, dict] = {}
        for i, c in enumerate(run["cases"]):
            if c.group != g or not ok[i]:
                continue
            d = per_n.setdefault(c.info["n"], {"survived": [], "lost": [], "values": {}})
            (d["survived"] if r[i] != 1.0 else d["lost"]).append(c.info["pos"])
            d["values"].setdefault(hexbits(run["out"][i]), []).append(c.info["pos"])
        big_pos = 0
        by_block: dict[int, int | None] = {}
        for bl in sorted(set(label.tolist())):
            best = None
            for n in sorted(per_n):
                pos = [q for q in per_n[n]["survived"] + per_n[n]["lost"] if label[q] == bl]
                if pos and all(q in per_n[n]["survived"] for q in pos):
                    best = n
            by_block[int(bl)] = best
        out[g] = {
            "max_n_survived_by_block": by_block,
            "max_n_in_big_terms_block": by_block.get(int(label[big_pos])),
            "per_n": {
                str(n): {
                    "n_survived": len(v["survived"]),
                    "n_lost": len(v["lost"]),
                    "lost_positions": v["lost"] if len(v["lost"]) < K else "all",
                    "results": {
                        h: (pos if len(pos) < 8 else f"{len(pos)} positions") for h, pos in v["values"].items()
                    },
                }
                for n, v in sorted(per_n.items())
            },
        }
    vals = [v["max_n_in_big_terms_block"] for v in out.values() if v["max_n_in_big_terms_block"] is not None]
    out["align_frac_bits"] = min(vals) if vals else None
    out["note"] = (
        "single-term groups: largest n such that 1 - 2**-n differs from 1 when the big term (1) and the small one "
        "(-2**-n) are in one block (needs a final rounding toward zero to see bits below the output precision); "
        "align_frac_bits is taken from 'multi' when it is conclusive."
    )
    return out


def _block_labels(blocks: list | None, K: int) -> np.ndarray:
    """Block index of each position (blocks: lists of positions); all 0 when unknown."""
    label = np.zeros(K, dtype=np.int64)
    for bi, blk in enumerate(blocks or []):
        label[[q for q in blk if q < K]] = bi
    return label


# rounding -------------------------------------------------------------------------------------------------
def round_fraction(x: Fraction, frac_bits: int, mode: str) -> Fraction:
    """Round the exact rational x to a binary float with `frac_bits` fraction bits (unbounded exponent)."""
    if x == 0:
        return Fraction(0)
    neg = x < 0
    a = -x if neg else x
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    q = Fraction(2) ** (e - frac_bits)
    t = a / q
    fl = t.numerator // t.denominator
    rem = t - fl
    if mode == "rz":
        up = False
    elif mode == "rne":
        up = rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1)
    elif mode == "rna":
        up = rem >= Fraction(1, 2)
    elif mode == "ru":
        up = rem > 0 and not neg
    elif mode == "rd":
        up = rem > 0 and neg
    else:
        raise ValueError(mode)
    r = (fl + (1 if up else 0)) * q
    return -r if neg else r


def rounding_cases(p: int, fa: int) -> list[Case]:
    """Named sums whose correctly rounded results differ between rounding modes.

    u = 2**-p is the ulp of the output at 1 and fa the number of fraction bits kept when aligning (so every
    term is a multiple of 2**-fa and nothing is lost before the final rounding). The carry tests need no
    sub-ulp bits: 1 + u + 1 = 2 + u is a tie at 2 (ulp 2u), 1 + 3u + 1 = 2 + 3u a tie with an odd lower
    neighbour. The sub-ulp tests need fa >= p + 1 (ties) or fa >= p + 2 (quarters)."""
    u = 2.0**-p
    tests = {
        "carry_pos_tie_even_1+u+1": [1.0, u, 1.0],
        "carry_neg_tie_even_1+u+1": [-1.0, -u, -1.0],
        "carry_pos_tie_odd_1+3u+1": [1.0, 3 * u, 1.0],
        "carry_neg_tie_odd_1+3u+1": [-1.0, -3 * u, -1.0],
    }
    if fa >= p + 1:
        tests.update(
            {
                "pos_tie_even_1+0.5u": [1.0, 0.5 * u],
                "neg_tie_even_1+0.5u": [-1.0, -0.5 * u],
                "pos_tie_odd_1+u+0.5u": [1.0, u, 0.5 * u],
                "neg_tie_odd_1+u+0.5u": [-1.0, -u, -0.5 * u],
            }
        )
    if fa >= p + 2:
        tests.update(
            {
                "pos_1+0.75u": [1.0, 0.75 * u],
                "neg_1+0.75u": [-1.0, -0.75 * u],
                "pos_1+0.25u": [1.0, 0.25 * u],
                "neg_1+0.25u": [-1.0, -0.25 * u],
                "pos_below1_1-0.25u": [1.0, -0.25 * u],
                "neg_below1_1-0.25u": [-1.0, 0.25 * u],
                "pos_below1_1-0.75u": [1.0, -0.75 * u],
                "pos_2-0.75u": [2.0, -0.75 * u],
            }
        )
    cases = []
    for name, terms in tests.items():
        info = {"terms": terms, "p": p}
        cases.append(Case("round_prod", name, [(k, v) for k, v in enumerate(terms)], info=info))
        cases.append(Case("round_c", name, [(k, v) for k, v in enumerate(terms[1:])], c=terms[0], info=info))
    return cases


def conclude_rounding(run: dict) -> dict:
    r = rel_results(run)
    ok = run["built"].ok
    out = {}
    for g in ("round_prod", "round_c"):
        consistent = set(ROUNDING_MODES)
        tests = {}
        for i, c in enumerate(run["cases"]):
            if c.group != g or not ok[i]:
                continue
            exact = sum(Fraction(t) for t in c.info["terms"])
            expect = {m: float(round_fraction(exact, c.info["p"], m)) for m in ROUNDING_MODES}
            got = float(r[i])
            match = [m for m in ROUNDING_MODES if expect[m] == got]
            consistent &= set(match)
            tests[c.name] = {"result": got, "result_bits": hexbits(run["out"][i]), "matches": match}
        out[g] = {"consistent_modes": sorted(consistent, key=ROUNDING_MODES.index), "tests": tests}
    both = set(out["round_prod"]["consistent_modes"]) & set(out["round_c"]["consistent_modes"])
    out["rounding"] = sorted(both, key=ROUNDING_MODES.index)
    out["note"] = "modes whose correctly rounded result (to output_frac_bits) matches every test in the group"
    return out


# tiny values, C passthrough, specials ----------------------------------------------------------------------
def tiny_cases(fmt: Fmt, p: int) -> list[Case]:
    cases = []
    for m in range(90, 171):
        for s in (1.0, 1.5):
            v = s * 2.0**-m
            cases.append(Case("tiny_prod", f"s{s}_m{m}", [(0, v)], absolute=True, info={"m": m, "s": s}))
        cases.append(Case("tiny_pair", f"m{m}", [(0, 2.0**-m), (1, 2.0**-m)], absolute=True, info={"m": m}))
        if m <= 149:
            cases.append(Case("tiny_c", f"m{m}", [], c=2.0**-m, absolute=True, info={"m": m}))
            cases.append(Case("tiny_c_prod", f"m{m}", [(0, 2.0**-m)], c=2.0**-m, absolute=True, info={"m": m}))
    for e0 in (60, 100, 110, 120, 124, 126, 127, 128, 130, 133, 136, 140):
        for n in range(1, p + 8):
            cases.append(
                Case(
                    "tiny_rel",
                    f"e{e0}_n{n}",
                    [(0, 2.0**-e0), (1, -(2.0 ** -(e0 + n)))],
                    absolute=True,
                    info={"e0": e0, "n": n},
                )
            )
    return cases


def conclude_tiny(run: dict) -> dict:
    out: dict = {}
    vals = run["out"].view(np.float32).astype(np.float64)
    ok = run["built"].ok
    ex = run["built"].exact
    for g in ("tiny_prod", "tiny_pair", "tiny_c", "tiny_c_prod"):
        rows = []
        for i, c in enumerate(run["cases"]):
            if c.group == g and ok[i]:
                e = float(ex[i])
                if e >= 2.0**-126:
                    rz = float(round_fraction(Fraction(ex[i]), 23, "rz"))
                else:
                    rz = math.floor(e / F32_MIN_SUB) * F32_MIN_SUB
                rows.append((c.name, c.info.get("m"), e, vals[i], rz))
        if not rows:
            out[g] = {"tested": 0}
            continue
        nonzero = [m for (_, m, _, v, _) in rows if v != 0]
        exact_ok = [m for (_, m, e, v, _) in rows if v == e]
        rz_ok = [m for (_, m, e, v, rz) in rows if v == rz]
        out[g] = {
            "tested": len(rows),
            "m_range": [min(r[1] for r in rows), max(r[1] for r in rows)],
            "largest_m_nonzero": max(nonzero) if nonzero else None,
            "n_exact": len(exact_ok),
            "n_equal_rz_of_exact": len(rz_ok),
            "deviating": [
                {"case": n, "exact": e, "got": v, "got_bits": hexbits(f32_bits(v))}
                for (n, _, e, v, rz) in rows
                if v != e and v != rz
            ][:16],
        }
    surv: dict[int, list[int]] = {}
    for i, c in enumerate(run["cases"]):
        if c.group == "tiny_rel" and ok[i]:
            big = 2.0 ** -c.info["e0"]
            if vals[i] != big:
                surv.setdefault(c.info["e0"], []).append(c.info["n"])
            else:
                surv.setdefault(c.info["e0"], [])
    out["tiny_rel"] = {
        str(e0): {"max_n_survived": max(ns) if ns else None, "survived_n": ns} for e0, ns in sorted(surv.items())
    }
    out["note"] = (
        "tiny_prod: one product s*2**-m alone; tiny_pair: two products 2**-m; tiny_c: C=2**-m with zero "
        "products; tiny_rel: 2**-e0 - 2**-(e0+n) (largest n for which the small term still counts, by e0). "
        "n_equal_rz_of_exact counts results equal to the exact value truncated to the float32 grid."
    )
    return out


def cpass_cases() -> list[Case]:
    cases = [Case("cpass", f"1+2^-{n}", [], c=1.0 + 2.0**-n, info={}) for n in range(1, 24)]
    for h in (0x3FAAAAAB, 0xBF800001, 0x3F7FFFFF, 0x4B7FFFFF, 0x00800001, 0x007FFFFF, 0x00000001, 0x7F7FFFFF):
        cases.append(Case("cpass", hexbits(h), [], c=bits_f32(h), absolute=True, info={}))
    cases.append(Case("cpass", "-0", [], c=-0.0, absolute=True, info={}))
    cases.append(Case("cpass", "+0", [], c=0.0, absolute=True, info={}))
    return cases


def special_cases(fmt: Fmt) -> list[Case]:
    big = fmt.max_finite
    cases = [
        Case("special", "all_products_-0_noc", [(k, ("abs", -0.0, 1.0)) for k in range(4)], absolute=True),
        Case("special", "all_products_-0_c-0", [(k, ("abs", -0.0, 1.0)) for k in range(4)], c=-0.0, absolute=True),
        Case("special", "max*max", [(0, ("abs", big, big))], absolute=True),
        Case("special", "max*max-max*max", [(0, ("abs", big, big)), (1, ("abs", -big, big))], absolute=True),
        Case("special", "max*max+C=-FLT_MAX", [(0, ("abs", big, big))], c=-bits_f32(0x7F7FFFFF), absolute=True),
        Case("special", "C=FLT_MAX+max*max", [(0, ("abs", big, big))], c=bits_f32(0x7F7FFFFF), absolute=True),
    ]
    if fmt.ieee:
        inf = math.inf
        cases += [
            Case("special", "inf*1", [(0, ("abs", inf, 1.0))], absolute=True),
            Case("special", "inf*0", [(0, ("abs", inf, 0.0))], absolute=True),
            Case("special", "inf-inf", [(0, ("abs", inf, 1.0)), (1, ("abs", -inf, 1.0))], absolute=True),
            Case("special", "C=inf", [], c=inf, absolute=True),
            Case("special", "C=nan", [], c=math.nan, absolute=True),
        ]
    return cases


def _encode_special(v: float, fmt: Fmt) -> int | None:
    if math.isinf(v) and fmt.ieee:
        top = (1 << fmt.ebits) - 1
        return (1 << (fmt.nbits - 1) if v < 0 else 0) | (top << fmt.mbits)
    return None


def conclude_simple(run: dict, groups: tuple) -> dict:
    out = {}
    vals = run["out"].view(np.float32)
    for g in groups:
        rows = {}
        for i, c in enumerate(run["cases"]):
            if c.group == g:
                if not run["built"].ok[i]:
                    rows[c.name] = {"skipped": run["built"].reason[i]}
                    continue
                e = run["built"].exact[i]
                rows[c.name] = {
                    "result_bits": hexbits(run["out"][i]),
                    "result": float(vals[i]),
                    "exact_sum_of_finite_terms": float(e) if e is not None else None,
                }
        out[g] = rows
    return out


# ----------------------------------------------------------------------------------------------------------
# Round 3: zero products
# ----------------------------------------------------------------------------------------------------------
def zero_cases(fmt: Fmt, F: int, p: int, block: int) -> list[Case]:
    """Absolute values: 1 (as C, or as a product at 0) plus m products -2**-n with m * 2**-n = 2**-(p+1) and n
    as close to F as fits in one block (so the small terms are visible whatever the final rounding), plus one
    zero product 0 * 2**e at the next position. A zero factor has exponent emin, so with e = emax the product's
    exponent emin + emax >= 1 exceeds that of the big term 1."""
    n = max(F, 1)
    m = max(1, 2 ** (n - p - 1))
    while m + 2 > block and n > p + 1:
        n -= 1
        m //= 2
    s = 2.0**-n
    exps = sorted({0, fmt.emax // 2, fmt.emax})
    smalls_c = [(k, -s) for k in range(m)]
    smalls = [(0, 1.0)] + [(k + 1, -s) for k in range(m)]
    info = {"n": n, "m": m}
    cases = [
        Case("zero_c", "base", list(smalls_c), c=1.0, absolute=True, info=info),
        Case("zero", "base", list(smalls), absolute=True, info=info),
    ]
    for eb in exps:
        big = 2.0**eb
        for za in (0.0, -0.0):
            for label, fac in ((f"a={za:+}_b=2^{eb}", (za, big)), (f"a=2^{eb}_b={za:+}", (big, za))):
                cases.append(Case("zero_c", label, smalls_c + [(m, ("abs", *fac))], c=1.0, absolute=True, info=info))
                cases.append(Case("zero", label, smalls + [(m + 1, ("abs", *fac))], absolute=True, info=info))
    return cases


def align_multi_cases(p: int, block: int) -> list[Case]:
    """1 (as C, or a product at 0) plus m = 2**(n-p-1) products -2**-n in the same block: the exact result
    1 - 2**-(p+1) is a float32 whatever the final rounding, so a result != 1 shows the alignment kept bit n."""
    cases = []
    n = p + 1
    while 2 ** (n - p - 1) <= block:
        m = 2 ** (n - p - 1)
        s = 2.0**-n
        info = {"n": n, "m": m}
        cases.append(Case("align_multi_c", f"n{n}", [(k, -s) for k in range(m)], c=1.0, info=info))
        if m + 1 <= block:
            cases.append(Case("align_multi_noc", f"n{n}", [(0, 1.0)] + [(k + 1, -s) for k in range(m)], info=info))
        n += 1
    return cases


def conclude_align_multi(run: dict) -> dict:
    r = rel_results(run)
    ok = run["built"].ok
    out: dict = {}
    for g in ("align_multi_c", "align_multi_noc"):
        rows, tested, kept = {}, [], []
        for i, c in enumerate(run["cases"]):
            if c.group == g and ok[i]:
                n = c.info["n"]
                tested.append(n)
                rows[str(n)] = {"m": c.info["m"], "result": float(r[i]), "bits": hexbits(run["out"][i])}
                if r[i] != 1.0:
                    kept.append(n)
        best = max(kept) if kept else None
        out[g] = {
            "tested_n": tested,
            "kept_n": kept,
            "max_n_kept": best,
            "at_test_limit": bool(tested) and best == max(tested),
            "results": rows,
        }
    vals = [out[g]["max_n_kept"] for g in ("align_multi_c", "align_multi_noc") if out[g]["max_n_kept"]]
    out["align_frac_bits"] = min(vals) if vals else None
    out["lower_bound_only"] = any(out[g]["at_test_limit"] for g in ("align_multi_c", "align_multi_noc"))
    out["note"] = (
        "m = 2**(n-p-1) products -2**-n next to 1 in one block; max_n_kept = largest n whose result differs "
        "from 1. Independent of the final rounding, unlike the single-term align groups."
    )
    return out


def conclude_zero(run: dict) -> dict:
    r = rel_results(run)
    ok = run["built"].ok
    out = {}
    for g in ("zero", "zero_c"):
        rows = {}
        base = None
        for i, c in enumerate(run["cases"]):
            if c.group == g and ok[i]:
                rows[c.name] = float(r[i])
                if c.name == "base":
                    base = float(r[i])
        changed = [k for k, v in rows.items() if k != "base" and v != base]
        out[g] = {"base": base, "results": rows, "changed_vs_base": changed}
    out["zero_products_affect_alignment"] = bool(out["zero"]["changed_vs_base"] or out["zero_c"]["changed_vs_base"])
    out["note"] = (
        "base = 1 - m*2**-n (m products -2**-n, n at the alignment limit); a zero product 0 * 2**eb is added. "
        "If zero products took part in the maximum exponent, the small terms would be lost."
    )
    return out


# ----------------------------------------------------------------------------------------------------------
# Whole single-element probe for one input type
# ----------------------------------------------------------------------------------------------------------
def probe_format(fmt: Fmt, K: int, dot_fn: DotFn, log=print, pair_K: int | None = None) -> tuple[dict, dict]:
    """Run all rounds for one input type. Returns (conclusions, arrays for the npz)."""
    arrays: dict = {}
    concl: dict = {"format": fmt.name, "K": K, "unit": 2.0**fmt.unit_exp}

    def go(cases, tag):
        run = run_cases(cases, fmt, K, dot_fn)
        b = run["built"]
        arrays[f"{tag}_a"] = b.a_bits
        arrays[f"{tag}_b"] = b.b_bits
        arrays[f"{tag}_c"] = b.c_bits
        arrays[f"{tag}_has_c"] = b.has_c
        arrays[f"{tag}_ok"] = b.ok
        arrays[f"{tag}_out"] = run["out"]
        arrays[f"{tag}_uniform"] = run["uniform"]
        arrays[f"{tag}_group"] = np.array([c.group for c in cases])
        arrays[f"{tag}_name"] = np.array([c.name for c in cases])
        nonuni = int((~run["uniform"] & b.ok).sum())
        concl.setdefault("non_uniform_cases", 0)
        concl["non_uniform_cases"] += nonuni
        concl.setdefault("cases_run", 0)
        concl["cases_run"] += int(b.ok.sum())
        concl.setdefault("cases_unrepresentable", 0)
        concl["cases_unrepresentable"] += int((~b.ok).sum())
        return run

    log(f"  {fmt.name}: round 1 (output precision)")
    r1 = go(survival_cases(K), "r1")
    s = conclude_survival(r1)
    concl["survival"] = s
    p = s["output_frac_bits"] or 10
    log(f"  {fmt.name}: output keeps {s['output_frac_bits']} fraction bits at 1; round 2")
    PK = pair_K or K
    cases2 = (
        pair_carry_cases(PK, p)
        + pair_small_cases(PK, p)
        + align_cases(K, p, max(1, p - 3), p + 10)
        + tiny_cases(fmt, p)
        + cpass_cases()
        + special_cases(fmt)
    )
    r2 = go(cases2, "r2")
    rr = rel_results(r2)
    idx = _index(r2)
    u = 2.0**-p
    before = np.zeros((PK, PK), dtype=bool)
    odd = []
    for i in range(PK):
        for j in range(PK):
            if i != j:
                t = idx[("pair_carry", f"i{i}_j{j}")]
                v = rr[t]
                before[i, j] = v == 1.0
                if v not in (1.0, 1.0 + u) and len(odd) < 16:
                    odd.append({"i": i, "j": j, "result": float(v)})
    arrays["pair_before"] = before
    blocks = infer_blocks(before)
    blocks["unexpected_results"] = odd
    concl["blocks"] = blocks
    label = _block_labels(blocks["blocks"], PK)
    comb_same, comb_diff, n_same, n_diff = 0, 0, 0, 0
    for i in range(PK):
        for j in range(i + 1, PK):
            v = rr[idx[("pair_small", f"i{i}_j{j}")]]
            if label[i] == label[j]:
                n_same += 1
                comb_same += v > 1.0
            else:
                n_diff += 1
                comb_diff += v > 1.0
    concl["pair_small"] = {
        "pairs_same_block": n_same,
        "combined_same_block": int(comb_same),
        "pairs_different_blocks": n_diff,
        "combined_different_blocks": int(comb_diff),
        "note": "two products 2**-(p+1) with C=1: 'combined' when the result is above 1",
    }
    concl["align"] = conclude_align(r2, blocks["blocks"] if blocks["consistent"] else None)
    concl["tiny"] = conclude_tiny(r2)
    concl["cpass_special"] = conclude_simple(r2, ("cpass", "special"))
    block0 = len(blocks["blocks"][0]) if blocks["consistent"] else fmt.kstep
    log(f"  {fmt.name}: blocks {blocks['block_sizes']}; round 3 (alignment with several small terms)")
    r3 = go(align_multi_cases(p, block0), "r3")
    multi = conclude_align_multi(r3)
    single = concl["align"]["align_frac_bits"]
    concl["align"]["single_term_frac_bits"] = single
    concl["align"]["multi"] = multi
    fa = multi["align_frac_bits"] or single or (p + 2)
    concl["align"]["align_frac_bits"] = multi["align_frac_bits"] or single
    log(f"  {fmt.name}: alignment keeps {fa} fraction bits; round 4 (rounding, zero products)")
    r4 = go(rounding_cases(p, fa) + zero_cases(fmt, fa, p, block0), "r4")
    concl["rounding"] = conclude_rounding(r4)
    concl["zero"] = conclude_zero(r4)
    concl["model"] = {
        "block": blocks["block_sizes"][0] if blocks["consistent"] and len(set(blocks["block_sizes"])) == 1 else None,
        "frac_bits": concl["align"]["align_frac_bits"],
        "out_frac_bits": p,
        "rounding": (concl["rounding"]["rounding"] or [None])[0],
        "zero_products_affect_alignment": concl["zero"]["zero_products_affect_alignment"],
    }
    return concl, arrays


# ----------------------------------------------------------------------------------------------------------
# Random stress tiles
# ----------------------------------------------------------------------------------------------------------
SCENARIOS = ("normal", "wide", "cancel", "zeros_huge", "subnormal", "ones_small", "exp_like", "random_bits")


def _gen_vectors(rng: np.random.Generator, fmt: Fmt, n: int, K: int, role: str):
    """n vectors of length K (bits) and their scenario codes. role 'a' or 'b' (b gets the duplicated halves
    that make cancellation with an 'a' cancel row exact)."""
    scen = rng.integers(0, len(SCENARIOS), size=n)
    vals = np.zeros((n, K))
    bits = np.zeros((n, K), dtype=np.int64)
    use_bits = np.zeros(n, dtype=bool)
    half = K // 2
    for i in range(n):
        s = SCENARIOS[scen[i]]
        if s == "normal":
            vals[i] = rng.standard_normal(K) * 2.0 ** rng.integers(-4, 5)
        elif s == "wide":
            # all normal exponents (bf16: 2**-60 .. 2**60, so that products stay inside float32)
            lo, hi = (127 - 60, 127 + 60) if fmt.name == "bf16" else (1, None)
            bits[i] = random_finite_bits(rng, K, fmt, lo, hi)
            use_bits[i] = True
        elif s == "cancel":
            x = rng.standard_normal(half) * 2.0 ** rng.integers(-3, 4)
            if role == "a":
                v = np.concatenate([x, -x, rng.standard_normal(K - 2 * half)])
                j = rng.integers(0, half, size=2)
                v[half + j] *= 1 + 2.0 ** -rng.integers(2, 8)
            else:
                v = np.concatenate([x, x, rng.standard_normal(K - 2 * half)])
            vals[i] = v
        elif s == "zeros_huge":
            v = np.zeros(K)
            nh = rng.integers(1, 4)
            v[rng.integers(0, K, size=nh)] = rng.choice([-1, 1], size=nh) * fmt.max_finite * rng.uniform(0.25, 1, nh)
            ns = rng.integers(1, 6)
            v[rng.integers(0, K, size=ns)] = rng.standard_normal(ns) * 2.0 ** -rng.integers(0, 12)
            vals[i] = v
        elif s == "subnormal":
            sub = random_finite_bits(rng, K, fmt, 0, 0)
            nor = random_finite_bits(rng, K, fmt, 1, 2)
            bits[i] = np.where(rng.random(K) < 0.7, sub, nor)
            use_bits[i] = True
        elif s == "ones_small":
            k = rng.integers(1, fmt.mbits + 12, size=K)
            v = rng.choice([-1.0, 1.0], size=K) * np.where(rng.random(K) < 0.3, 1.0, 2.0 ** -k.astype(float))
            vals[i] = v
        elif s == "exp_like":
            v = 2.0 ** -rng.uniform(0, 20, K)
            v[rng.integers(0, K, size=rng.integers(1, 4))] = 1.0
            vals[i] = v
        else:
            bits[i] = random_finite_bits(rng, K, fmt)
            use_bits[i] = True
    rounded = round_to_fmt(vals, fmt)
    # encode the rounded values row-wise (they are exact now)
    enc = encode_array(np.where(use_bits[:, None], 0.0, rounded), fmt).astype(np.int64)
    bits = np.where(use_bits[:, None], bits, enc)
    return bits.astype(fmt.uint), scen.astype(np.int8)


def gen_stress_tiles(rng: np.random.Generator, fmt: Fmt, K: int, n_tiles: int, has_c: bool) -> dict:
    """Random 64xK A tiles, 64xK B^T tiles (row n of B^T = column n of B) and 64x64 fp32 C tiles."""
    a, sa = _gen_vectors(rng, fmt, n_tiles * 64, K, "a")
    bt, sb = _gen_vectors(rng, fmt, n_tiles * 64, K, "b")
    out = {
        "a": a.reshape(n_tiles, 64, K),
        "bt": bt.reshape(n_tiles, 64, K),
        "scen_a": sa.reshape(n_tiles, 64),
        "scen_b": sb.reshape(n_tiles, 64),
    }
    if has_c:
        kind = rng.integers(0, 4, size=(n_tiles, 64, 64))
        mag = 2.0 ** rng.integers(-40, 41, size=(n_tiles, 64, 64)).astype(float)
        c = np.where(kind == 0, 0.0, rng.standard_normal((n_tiles, 64, 64)) * mag)
        c = np.where(kind == 2, rng.standard_normal((n_tiles, 64, 64)), c)
        c32 = c.astype(np.float32)
        rb = rng.integers(0, 2**32, size=(n_tiles, 64, 64), dtype=np.uint64).astype(np.uint32)
        rb = np.where(((rb >> 23) & 0xFF) == 0xFF, rb & 0xBFFFFFFF, rb)  # no inf/nan
        c32 = np.where(kind == 3, rb.view(np.float32), c32)
        out["c"] = c32.view(np.uint32)
    return out


def stress_model_matches(fmt: Fmt, tiles: dict, d_bits: np.ndarray, model: ef.FusedBlock | str) -> dict:
    """Compare GPU outputs d_bits [n,64,64] with `emufloat.matmul` under `model` (a FusedBlock, e.g. from
    `block_model` or `PUBLISHED`, or an emufloat preset name) for every (row, col) dot product."""
    a = np.asarray(tiles["a"]).view(fmt.dtype)  # [n, 64, K]
    bt = np.asarray(tiles["bt"]).view(fmt.dtype)  # [n, 64, K]: row j is column j of B
    c = np.asarray(tiles["c"]).view(np.float32) if "c" in tiles else None
    model_bits = np.empty((a.shape[0], 64, 64), dtype=np.uint32)
    for t in range(a.shape[0]):
        d = ef.matmul(a[t], bt[t].T, model, None if c is None else c[t])
        model_bits[t] = np.asarray(d, dtype=np.float32).view(np.uint32)
    model_bits = model_bits.reshape(-1)
    got = d_bits.reshape(-1).astype(np.uint32)
    gotf, modf = got.view(np.float32), model_bits.view(np.float32)
    eq = (got == model_bits) | (np.isnan(gotf) & np.isnan(modf))
    sa = np.repeat(tiles["scen_a"][:, :, None], 64, axis=2).reshape(-1)
    per_scen = {SCENARIOS[s]: [int(eq[sa == s].sum()), int((sa == s).sum())] for s in range(len(SCENARIOS))}
    first = np.nonzero(~eq)[0][:5]
    return {
        "n": int(got.size),
        "match": int(eq.sum()),
        "by_row_scenario": per_scen,
        "first_mismatches": [{"index": int(i), "gpu": hexbits(got[i]), "model": hexbits(model_bits[i])} for i in first],
    }
