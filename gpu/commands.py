"""Argument checks the device scripts share (studies/device, `python -m gpu.crosscheck`, `studies.probes.run`):
each bad argument ends the script with one line naming it, before any GPU work (run the script's `main`
through `flashsim.console.run_command`).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from flashsim.console import UsageError


def gpu_stack_missing() -> str | None:
    """Why GPU work cannot run here (torch or Triton missing, no CUDA GPU), or None when it can."""
    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return (
            f"needs torch and Triton with a CUDA GPU; {' and '.join(missing)} not installed (pip install "
            "'lowprec-attention[gpu]')"
        )
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU; torch sees none on this machine"
    return None


def missing_extra(module: str, name: str, exc: ImportError, needs: str = "torch and Triton") -> Exception:
    """What the device script `module` raises when its top-level import of the `gpu` extra fails (`raise
    missing_extra("studies.device.X", __name__, exc) from None`): run as a script (`name == "__main__"`), a
    SystemExit that ends it in one line; imported, a ModuleNotFoundError naming what is missing, which a caller can
    catch (`pytest.importorskip` skips on it) instead of the whole process ending."""
    missing = getattr(exc, "name", None) or str(exc)
    message = f"{module}: needs {needs} ({missing} is not installed); pip install 'lowprec-attention[gpu]'"
    return SystemExit(message) if name == "__main__" else ModuleNotFoundError(message, name=missing)


def require_gpu(prog: str) -> None:
    """A UsageError unless torch, Triton and a CUDA GPU are here."""
    why = gpu_stack_missing()
    if why:
        raise UsageError(f"{prog}: {why}")


def probe_main(module: str, description: str, outputs: str, run, argv: list[str] | None = None) -> int:
    """`main` of a standalone probe, `python -m MODULE --out DIR`: the folder is checked to be writable and
    the GPU to be there before `run(DIR)`; bad input and failures end in one line."""
    from flashsim.console import ArgumentParser, run_command, writable_dir

    prog = f"python -m {module}"
    ap = ArgumentParser(prog=prog, description=description)
    ap.add_argument("--out", type=Path, required=True, help=f"folder for {outputs}")
    args = ap.parse_args(argv)

    def go() -> int:
        out = writable_dir(args.out, "--out")
        require_gpu(prog)
        return run(out)

    return run_command(prog, go)


def sections(value: str, accepted, flag: str = "--sections") -> list[str]:
    """A comma list of names, each one of `accepted`."""
    names = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [n for n in names if n not in accepted]
    if not names or unknown:
        raise UsageError(f"{flag}: unknown or no name(s) {unknown or value!r}; accepted: {', '.join(accepted)}")
    return names


def positive(value: float, flag: str) -> float:
    """A finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag}: expected a positive number, got {value}")
    return value


def json_params(value: str, flag: str = "--params") -> dict:
    """A JSON object given on the command line."""
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{flag}: not valid JSON ({exc.msg} at character {exc.pos}); expected an object such as '{{\"name\": 1}}'"
        ) from None
    if not isinstance(obj, dict):
        raise UsageError(f"{flag}: expected a JSON object ({{...}}), got {type(obj).__name__}")
    return obj


__all__ = ["gpu_stack_missing", "json_params", "missing_extra", "positive", "require_gpu", "sections"]
