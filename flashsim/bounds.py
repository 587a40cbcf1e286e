"""How far a kernel that rounds as a policy says may be from exact attention: a per-element forward error bound.

`attention_bound()` gives exact O and LSE of one head (FP64 on its values) and the bound;
`check_attention()` says whether a kernel's outputs lie within it, or that the kernel computes another function
than attention (every cross-check reports it: `flashsim.crosscheck`);
`flashsim.testing.assert_matches_policy(within_rounding=True)` judges a kernel that rounds differently with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emufloat import FP32, Exact, Format, FusedBlock, Pairwise, Rounding, Sequential
from emufloat.accum import TiledK

from .arith import cast as _cast
from .causal import visible_matrix
from .functions import get_function
from .policy import Policy
from .softmax import (
    CastSumSoftmax,
    DitheredSoftmax,
    RobustSoftmax,
    SoftmaxVariant,
    StabilisedSoftmax,
    StandardSoftmax,
    get_softmax,
    sums_cast_p,
)
from .specs import NUMPY, ByShape, is_native


@dataclass(frozen=True)
class RoundingBound:
    """Exact attention of one case (FP64 on the case's values) and how far a kernel under a policy may be from it.

    ``o`` (N_q, d) and ``lse`` (N_q,; in the units of the policy's ``lse`` step, base 2 or e) are exact;
    ``o_bound`` and ``lse_bound`` are per element.  Rows that attend no key have NaN O, -inf LSE, bound 0.
    """

    o: np.ndarray
    lse: np.ndarray
    o_bound: np.ndarray
    lse_bound: np.ndarray


_HW_FUNC_REL = 2.0**-20  # a hardware exp/log model's own error, relative (ex2.approx, lg2.approx: about 2^-22)
_HW_FUNC_ARG = 2.0**-22  # ... and its argument's roundings (x * log2 e in FP32, twice): |x| 2^-22 in ln units


def _unit(fmt: Format, rounding: Rounding | None = None) -> float:
    """Relative error of one rounding into ``fmt``: 2^-p to nearest, 2^(1-p) for the other modes."""
    p = 53 if is_native(fmt) else fmt.precision
    nearest = rounding is None or rounding.mode in ("rne", "rna")
    return math.ldexp(1.0, -p if nearest else 1 - p)


def _step_unit(spec) -> float:
    """Relative error of an elementwise step: its compute rounding (if any), then its store."""
    u = _unit(spec.fmt, spec.rounding)
    if getattr(spec, "compute", None) is not None and spec.compute != spec.fmt:
        u += _unit(spec.compute)
    return u


def _tiny(fmt: Format) -> float:
    """Absolute error of one rounding near zero: the subnormal spacing, or the smallest normal without subnormals."""
    return 2.0**-1074 if is_native(fmt) else fmt.min_subnormal


def _compound(steps: float, u: float) -> float:
    """(1 + u)^steps - 1: the relative error of a term after ``steps`` roundings of relative error ``u``."""
    return math.expm1(steps * math.log1p(u))


def _sum_theta(model: object, n: int, blocks: int = 1) -> float:
    """Relative backward error per term of a sum of ``n`` terms under ``model``, computed in ``blocks`` calls
    whose running sum carries over (a row's P V and l across its K/V blocks).

    A sum computed with an absolute error E <= t * sum|x_j| equals sum x_j (1 + t_j) with |t_j| <= t, so a
    tensor core's truncation (at most (width + 1) 2^-align_bits of the step's largest term, C included) counts
    as a per-term error like a rounding does."""
    if isinstance(model, str) and model == NUMPY:
        return _compound(n + blocks, 2.0**-53)
    if isinstance(model, ByShape):  # whichever product shape: the worst of its models
        return max((_sum_theta(m, n, blocks) for _, m in model.table), default=0.0)
    if isinstance(model, TiledK):  # the step's chains, a padded step and an FP32 reduce add per slice
        step = model.step
        err = (step.width + 1) * 2.0**-step.align_bits + _unit(step.acc_fmt, step.final_rounding) + _unit(step.fmt)
        return _compound(math.ceil(n / step.width) + 2 * model.splits + blocks, err)
    if isinstance(model, FusedBlock):
        step = (model.width + 1) * 2.0**-model.align_bits + _unit(model.acc_fmt, model.final_rounding)
        return _compound(math.ceil(n / model.width) + blocks, step + _unit(model.fmt))
    u = _unit(model.fmt, model.rounding)
    if isinstance(model, Exact):
        return _compound(2 * blocks, u)
    if isinstance(model, Pairwise):
        return _compound(model.base + math.ceil(math.log2(max(n, 2))) + 2 * blocks, u)
    if isinstance(model, Sequential):
        return _compound((n + blocks) * (1 if model.fused else 2), u)
    raise ValueError(f"policy: no rounding bound for the accumulation model {type(model).__name__}")


def _extra_shift(variant: SoftmaxVariant, row_max: np.ndarray) -> np.ndarray:
    """How far above the row max (natural-log units) the variant may put the shift m: P's largest value is
    at least e^-shift, so l >= e^-shift."""
    if isinstance(variant, (StandardSoftmax, CastSumSoftmax)):
        return np.zeros_like(row_max)
    if isinstance(variant, RobustSoftmax):
        return np.full_like(row_max, float(variant.max_shift))
    if isinstance(variant, DitheredSoftmax):
        return np.full_like(row_max, variant.band + math.log(2.0))
    if isinstance(variant, StabilisedSoftmax):  # m = beta r (r > 0) or 0 (r < 0): beyond r by (beta - 1) r or |r|
        return max(variant.beta - 1.0, 1.0) * np.abs(row_max)
    raise ValueError(
        f"softmax: within_rounding knows the shifts of the standard, stabilised, robust, dithered and cast_sum "
        f"variants; got {type(variant).__name__}"
    )


def _function_error(name: str) -> tuple[float, float]:
    """(relative error, error per unit of |argument|) of an exp/log model beyond the rounding into its format."""
    if get_function(name).hardware:
        return _HW_FUNC_REL, _HW_FUNC_ARG
    return 0.0, 0.0


def attention_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    policy: Policy,
    softmax: SoftmaxVariant | str = "standard",
    sm_scale: float | None = None,
    causal: bool | str = False,
) -> RoundingBound:
    """Exact O and LSE of one head (q (N_q, d), k (N_k, d), v (N_k, dv), as values) and, per element, how far a
    kernel that rounds as ``policy`` says may be from them: a forward error bound from the policy's formats, the
    accumulation lengths and |P||V|.

    Derivation.  O = sum_j w_j v_j, w = softmax(c s).  Each rounding is a factor (1 + e), |e| <= u = 2^-p
    (2^(1-p) if not to nearest), and a sum's errors are per-term factors (backward error; a tensor core's
    truncation too), so the kernel computes O' = sum_j P_j a_j v_j / sum_j P_j b_j, |log a_j| <= dP_j + dN,
    |log b_j| <= dP_j + dD: dP_j moves P_j (scores' sums over d and store, scale, the subtraction's rounding of
    |x_j|, the exp model), dN only the numerator (P cast, P V sums, rescales), dD only l.  With
    beta = sum_j w_j (e^(dP_j + dD) - 1): |O' - O| <= (sum_j w_j (e^(dP_j + dN) - 1) |v_j| + beta |O|) / (1 - beta),
    plus tau sum_j |v_j| / l_min for values near zero (subnormal spacing; l >= e^-shift, the variant's shift
    above the max), (u_norm + u_out) |O| and the output's subnormal spacing; LSE is off by -log(1 - beta) plus
    the log's and the LSE step's roundings.  For an FP32 accumulator and a BF16 P this is the kernels' property
    bound (2u + 2 n_k 2^-23 + 2^-20) max|v| (tests/gpu/test_kernel_properties.py), per element with |P||V|.
    """
    pol = policy
    variant = get_softmax(softmax)
    q0, k0, v0 = q, k, v
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n_q, d = q.shape
    n_k = k.shape[0]
    c = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    units = math.log2(math.e) if pol.lse.base == "2" else 1.0

    # exact attention on the case's values
    visible = visible_matrix(causal, n_q, n_k)
    nat = c * (q @ k.T)
    nat_v = np.where(visible, nat, -np.inf)
    row_max = nat_v.max(axis=1, initial=-np.inf)
    seen = np.isfinite(row_max)
    top = np.where(seen, row_max, 0.0)
    with np.errstate(under="ignore"):
        e = np.where(visible, np.exp(nat_v - top[:, None]), 0.0)
    denom = e.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = e / denom[:, None]
        o = w @ v
        lse_nat = top + np.log(denom)
    o[~seen] = np.nan
    lse_nat[~seen] = -np.inf

    # the inputs as the policy rounds them
    qh = np.asarray(_cast(q0, pol.scores.inputs), np.float64)
    kh = np.asarray(_cast(k0, pol.scores.inputs), np.float64)
    vh = np.asarray(_cast(v0, pol.pv.inputs), np.float64)
    s_in = np.abs(qh @ kh.T - q @ k.T)
    s_abs = np.abs(qh) @ np.abs(kh).T
    n_blocks = math.ceil(n_k / pol.tiling.block_n)

    # dP: what moves P_j (natural-log units, per row and key)
    theta_s = _sum_theta(pol.scores.model, d)
    s_hat = np.abs(qh @ kh.T)
    extra = np.where(seen, _extra_shift(variant, top), 0.0)
    big = max(_step_unit(pol.max), _step_unit(pol.scale), _unit(pol.scores.fmt, pol.scores.rounding))
    spread = np.where(visible, top[:, None] - nat, 0.0)
    x_abs = spread + extra[:, None] + 4 * big * (np.max(np.abs(np.where(visible, nat, 0.0)), axis=1) + extra)[:, None]
    exp_rel, exp_arg = _function_error(pol.exp.function)
    d_p = (
        c * (theta_s * s_abs + _unit(pol.scores.fmt, pol.scores.rounding) * s_hat + s_in)
        + (2 + pol.scale.split) * _step_unit(pol.scale) * c * s_hat
        + _step_unit(pol.subtract) * x_abs
        + exp_rel
        + exp_arg * x_abs
        + _step_unit(pol.exp)
    )
    d_p = np.where(visible, d_p, 0.0)
    # dN: the numerator's own roundings; dD: l's
    u_pc = _step_unit(pol.p_cast)
    d_n = (
        math.log1p(u_pc)
        + math.log1p(_sum_theta(pol.pv.model, n_k, n_blocks))
        + n_blocks * math.log1p(_unit(pol.pv.fmt, pol.pv.rounding) + _step_unit(pol.rescale))
        + (0.0 if pol.pv.into_acc else n_blocks * math.log1p(_step_unit(pol.o_accum)))
    )
    rs = pol.row_sum
    rs_model = NUMPY if rs.order == NUMPY else Sequential(rs.compute or rs.fmt, rs.rounding, fused=True)
    cast_p = sums_cast_p(variant, rs.fmt)
    d_d = (
        (math.log1p(u_pc) if cast_p else 0.0)
        + math.log1p(_sum_theta(rs_model, n_k, n_blocks))
        + n_blocks * math.log1p((1 if rs.fused else 2) * _step_unit(rs))
    )
    # values near zero: flushed or rounded on the subnormal grid, relative to l >= e^-shift
    tau_exp = FP32.min_normal if get_function(pol.exp.function).hardware else _tiny(pol.exp.fmt)
    tau_n = tau_exp + _tiny(pol.p_cast.fmt)
    tau_d = tau_exp + (_tiny(pol.p_cast.fmt) if cast_p else 0.0)
    acc_fmt = pol.pv.fmt if pol.pv.into_acc else pol.o_accum.fmt
    zeta_n = n_blocks * (_tiny(acc_fmt) + _tiny(pol.rescale.fmt) + _tiny(pol.pv.fmt))
    zeta_d = n_blocks * (_tiny(rs.fmt) + (rs.floor or 0.0))
    l_min = np.exp(-extra)
    n_vis = visible.sum(axis=1)

    w0 = np.where(visible, np.nan_to_num(w), 0.0)
    alpha = np.expm1(d_p + d_n)
    beta = (w0 * np.expm1(d_p + d_d)).sum(axis=1) + (n_vis * tau_d + zeta_d) / l_min
    mag = w0 @ np.abs(v)  # sum_j w_j |v_j|: the |P||V| magnitude of each element
    o0 = np.nan_to_num(np.abs(o))
    num = (w0 * alpha) @ np.abs(vh) + (tau_n * (visible @ np.abs(vh)) + zeta_n) / l_min[:, None]
    splits = pol.tiling.kv_splits
    with np.errstate(divide="ignore", invalid="ignore"):
        l_err = np.where(beta < 1, -np.log1p(-np.minimum(beta, 1.0)), np.inf)  # |log l' - log l|
    log_rel, _ = _function_error(pol.lse.function)
    log_l = np.log(np.maximum(n_vis, 1)) + extra + np.where(np.isfinite(l_err), l_err, 0.0)
    m_abs = np.max(np.abs(np.where(visible, nat, 0.0)), axis=1) + extra
    # m + log l: the log model, the rounding of log l, of m (times c, or divided by log2 e) and of the sum
    lse_err = l_err + log_rel * (1 + log_l) + 4 * _step_unit(pol.lse) * (m_abs + log_l + np.nan_to_num(np.abs(lse_nat)))
    with np.errstate(divide="ignore", invalid="ignore"):
        if splits > 1:  # each split's O in FP32, merged with weights exp(lse_i - L) (FP32 exp and log models)
            comb_rel, comb_arg = _function_error(pol.combine.exp)
            rho = np.expm1(2 * lse_err + comb_rel + comb_arg * 2 * (m_abs + log_l + 1) + 2.0**-22 * (splits + 2))
            delta_w = (num + beta[:, None] * mag + rho[:, None] * mag) / (1 - beta[:, None])
            lse_err = lse_err + 2.0**-20 * (1 + math.log(splits)) + 2.0**-23 * (m_abs + log_l + 1)
        else:
            delta_w = (num + beta[:, None] * o0) / (1 - beta[:, None])
    delta_w = np.where((beta < 1)[:, None], delta_w, np.inf) + w0 @ np.abs(vh - v)
    norm = pol.normalize
    e_norm = _step_unit(norm) * (2 if norm.method == "reciprocal" else 1) * (1 if norm.division == "ieee" else 4)
    e_out = _step_unit(pol.output)
    slack = 2.0**-40 * (1 + np.max(np.abs(np.where(visible, nat, 0.0)), axis=1))  # FP64's own error here
    o_bound = (
        (1 + e_norm) * (1 + e_out) * delta_w
        + (e_norm + e_out + e_norm * e_out) * o0
        + _tiny(pol.output.fmt)
        + _tiny(norm.fmt)
        + slack[:, None] * (mag + o0)
    )
    lse_bound = units * (lse_err + slack * (1 + np.abs(np.nan_to_num(lse_nat))))
    o_bound[~seen] = 0.0
    lse_bound[~seen] = 0.0
    return RoundingBound(o, lse_nat * units, o_bound, lse_bound)


@dataclass(frozen=True)
class AttentionCheck:
    """A kernel's O and LSE against FP64 attention of the same inputs, with the bound its policy's rounding allows.

    ``n``: elements of O compared (rows that attend some key; the others are not compared); ``nonfinite``: elements
    of O that are NaN or infinite where attention is finite (counted, never compared); ``beyond``: finite elements
    of O beyond their bound; ``lse_n``, ``lse_beyond``: the same for the LSE (0 when the kernel gave none);
    ``worst``: (head, row, column, |O - attention|, bound) of the element of O furthest beyond its bound;
    ``rows_skipped``: rows not compared (they attend no key, or attention is not finite there: non-finite inputs).
    """

    n: int
    nonfinite: int
    beyond: int
    lse_n: int
    lse_beyond: int
    worst: tuple[int, int, int, float, float] | None
    rows_skipped: int = 0

    @property
    def attention(self) -> bool:
        """Whether the outputs are attention's, as far as rounding under the policy allows."""
        return self.nonfinite == 0 and self.beyond == 0 and self.lse_beyond == 0

    def __str__(self) -> str:
        skipped = (
            f" ({self.rows_skipped} rows not compared: no key, or attention not finite)" if self.rows_skipped else ""
        )
        if self.attention:
            return (
                f"attention: O ({self.n} elements) and LSE ({self.lse_n}) within the rounding bound of FP64 "
                f"attention{skipped}"
            )
        parts = [f"{self.nonfinite} non-finite where attention is finite"] if self.nonfinite else []
        parts.append(f"{self.beyond} of {self.n} elements of O")
        parts += [f"{self.lse_beyond} of {self.lse_n} LSEs"] if self.lse_n else []
        line = f"attention: the kernel computes another function: {', '.join(parts)} beyond the bound rounding allows"
        if self.worst is not None:
            h, r, c, err, bound = self.worst
            line += (
                f"; worst: head {h}, row {r}, column {c}: |O - attention| = {err:.3g} where rounding allows {bound:.3g}"
            )
        return line + skipped


def check_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray | None,
    policy: Policy,
    softmax: SoftmaxVariant | str = "standard",
    sm_scale: float | None = None,
    causal: bool | str = False,
) -> AttentionCheck:
    """A kernel's outputs (``o`` (H, N_q, dv) and ``lse`` (H, N_q) or None, as values, the LSE in the units of the
    policy's lse step) against FP64 attention of its inputs (H, N, d), each element within `attention_bound()`."""
    n = nonfinite = beyond = lse_n = lse_beyond = skipped = 0
    worst, worst_ratio = None, 0.0
    for h in range(q.shape[0]):
        b = attention_bound(q[h], k[h], v[h], policy, softmax, sm_scale, causal)
        seen = np.isfinite(b.lse) & np.isfinite(b.o).all(axis=-1)
        skipped += int((~seen).sum())
        oh = np.asarray(o[h], np.float64)[seen]
        finite = np.isfinite(oh)
        n += oh.size
        nonfinite += int((~finite).sum())
        err = np.where(finite, np.abs(oh - b.o[seen]), 0.0)
        bound = b.o_bound[seen]
        over = err > bound
        beyond += int(over.sum())
        if over.any():
            ratio = np.where(over, err / np.maximum(bound, np.finfo(np.float64).tiny), 0.0)
            i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            if ratio[i] > worst_ratio:
                worst_ratio = float(ratio[i])
                row = int(np.flatnonzero(seen)[i[0]])
                worst = (h, row, int(i[1]), float(err[i]), float(bound[i]))
        if lse is not None:
            lh = np.asarray(lse[h], np.float64)[seen]
            lse_n += lh.size
            lse_beyond += int((~(np.abs(lh - b.lse[seen]) <= b.lse_bound[seen])).sum())
    return AttentionCheck(n, nonfinite, beyond, lse_n, lse_beyond, worst, skipped)


__all__ = ["AttentionCheck", "RoundingBound", "attention_bound", "check_attention"]
