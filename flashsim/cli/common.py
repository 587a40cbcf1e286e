"""What the commands share: the softmax variants, the policy and its arguments, the --allow-import opt-in."""

from __future__ import annotations

import argparse
import json
import math

from ..console import (
    UsageError,
)
from ..policy import ALIASES, PolicyRef, get_policy, policy_names
from ..softmax import VARIANTS, StabilisedSoftmax, get_softmax
from ..trust import allowed_modules


def softmax_variants(spec: str, beta: float | None, eps: float | None) -> list:
    sets = {"both": ("standard", "stabilised"), "all": tuple(VARIANTS)}  # "all": registered ones included
    names = sets.get(spec, tuple(x.strip() for x in spec.split(",") if x.strip()))
    if not names:
        raise UsageError(f"--softmax: expected standard, stabilised, robust, both, all or a comma list, got {spec!r}")
    for i, n in enumerate(names):
        if n not in VARIANTS:
            raise UsageError(f"--softmax: unknown variant {n!r}; accepted: {', '.join(VARIANTS)}, both, all")
        if n in names[:i]:
            raise UsageError(f"--softmax: {n!r} is listed twice in {spec!r}")
    if "stabilised" not in names:
        for flag, val in (("--beta", beta), ("--eps", eps)):
            if val is not None:
                raise UsageError(
                    f"{flag}: applies to the stabilised softmax only, and --softmax {spec} does not include it"
                )
    out = []
    for n in names:
        if n == "stabilised" and (beta is not None or eps is not None):
            try:
                out.append(
                    StabilisedSoftmax(**{key: val for key, val in (("beta", beta), ("eps", eps)) if val is not None})
                )
            except ValueError as exc:
                msg = str(exc)
                flag = "--beta" if msg.startswith("beta") else "--eps" if msg.startswith("eps") else "--beta/--eps"
                raise UsageError(f"{flag}: {msg}") from None
        else:
            out.append(get_softmax(n))
    return out


def allow_import(args: argparse.Namespace) -> bool | tuple[str, ...]:
    """The modules ``--allow-import`` names (checked): what a ``module:function`` target may import."""
    try:
        return allowed_modules(args.allow_import or (), "--allow-import")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def policy_arg(name: str, args_json: str = "{}", allow: bool | tuple[str, ...] = ()):
    """A registered policy, or ``module:function`` called with ``--policy-args`` (JSON keyword arguments): a
    registered policy function, or one of a module ``--allow-import`` names."""
    try:
        kwargs = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--policy-args: not JSON ({exc.msg}): {args_json!r}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--policy-args: expected a JSON object of keyword arguments, got {args_json!r}")
    if kwargs and ":" not in name:
        raise UsageError(f"--policy-args: only a 'module:function' --policy takes arguments; {name!r} is a name")
    try:
        return PolicyRef(name, kwargs).resolve(allow) if ":" in name else get_policy(name)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--policy: {str(exc).removeprefix('policy: ')}") from None


def positive(value: int | float | None, flag: str, kind=int, minimum=1) -> None:
    if value is not None and not (math.isfinite(value) and value >= minimum):
        raise UsageError(f"{flag}: expected {'an integer' if kind is int else 'a number'} >= {minimum}, got {value}")


POLICY_ARGS_HELP = "with --policy module:function (e.g. gpu.policies:sdpa_flash_policy), its keyword arguments as JSON"


ALLOW_IMPORT_HELP = (
    "a module whose 'module:function' {what} may be imported (repeat for more); without it only registered policies "
    "and policy functions resolve, so a file never makes flashsim import code (docs/flashsim.md, 'Code named in files')"
)


def add_allow_import(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--allow-import", action="append", metavar="MODULE", help=ALLOW_IMPORT_HELP.format(what=what))


def add_policy_arguments(parser: argparse.ArgumentParser, default_help: str) -> None:
    """--policy, --policy-args and --allow-import, as trace-row and bias-rows take them."""
    names = ", ".join(policy_names()) + "; aliases " + ", ".join(f"{a}={t}" for a, t in sorted(ALIASES.items()))
    parser.add_argument(
        "--policy", default="qiu_yao", metavar="NAME", help=f"precision policy ({names}); {default_help}"
    )
    parser.add_argument("--policy-args", default="{}", metavar="JSON", help=POLICY_ARGS_HELP)
    add_allow_import(parser, "--policy")
