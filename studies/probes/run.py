"""Run the GPU calibration probes: `python -m studies.probes.run --out $OUT` (see docs/probes.md).

The parent process imports neither torch nor triton. It runs the environment record and then each probe in
its own child process (so a crashed kernel or a poisoned CUDA context cannot take the others down), with a
time limit per probe inside an overall budget; it streams the children's output to stdout and to
`$OUT/run.log`, and merges their results into `$OUT/results.json` after every probe.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from gpu.commands import json_params, positive, sections

from . import PROBES
from .common import SCHEMA, ProbeContext, check_out_dir, summary_table, validate_results, write_json

# seconds: (cap, minimum worth starting with)
CAPS = {"env": (90, 30), "exp2": (120, 40), "division": (60, 20), "mma": (150, 45), "reduction": (80, 25)}
GRACE = 25  # seconds past a child's own deadline before it is killed
REPO = Path(__file__).resolve().parents[2]


#: what a run records: the environment, then the probes
NAMES = ("env", *PROBES)


def probe_module(name: str) -> ModuleType:
    """The module of the probe `name` (one of `NAMES`), imported by a fixed mapping: a name from the
    command line imports no other module.  The probes import torch and Triton, so only when run."""
    if name == "env":
        from . import env as mod
    elif name == "exp2":
        from . import exp2 as mod
    elif name == "division":
        from . import division as mod
    elif name == "mma":
        from . import mma as mod
    elif name == "reduction":
        from . import reduction as mod
    else:
        raise ValueError(f"probe: expected one of {', '.join(NAMES)}, got {name!r}")
    return mod


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Log:
    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        self.f.write(msg + "\n")

    def close(self) -> None:
        self.f.close()


# ----------------------------------------------------------------------------------------------------------
# child
# ----------------------------------------------------------------------------------------------------------
def run_child(name: str, out: Path, result_file: Path, seconds: float, quick: bool, device: str, seed: int,
              params: dict) -> int:  # fmt: skip
    partial_file = result_file.with_name(result_file.name + ".partial")
    ctx = ProbeContext(out=out, device=device, quick=quick, deadline=time.monotonic() + seconds, seed=seed)
    ctx.params = params  # type: ignore[attr-defined]
    ctx.checkpoint = lambda partial: write_json(partial_file, partial)
    t0 = time.monotonic()
    rec: dict = {}
    try:
        res = probe_module(name).run(ctx)
        rec = {"status": "ok", "result": res}
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exc()
        print(tb, flush=True)
        rec = {"status": "error", "error": repr(e)[:1000], "traceback": tb[-8000:]}
        if partial_file.exists():
            rec["result"] = json.loads(partial_file.read_text())
    rec["seconds"] = time.monotonic() - t0
    write_json(result_file, rec)
    return 0


# ----------------------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------------------
def _reader(stream, q: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        q.put(line.rstrip("\n"))
    q.put(None)


def spawn(name: str, args, seconds: float, log: Log, tmp: Path) -> dict:
    result_file = tmp / f"{name}.json"
    cmd = [
        sys.executable, "-m", "studies.probes.run", "--out", str(args.out), "--child", name,
        "--result-file", str(result_file), "--seconds", str(seconds), "--device", args.device, "--seed", str(args.seed),
        "--params", json.dumps(args.params_obj),
    ] + (["--quick"] if args.quick else [])  # fmt: skip
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
        start_new_session=True,
    )  # fmt: skip
    q: queue.Queue = queue.Queue()
    th = threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True)
    th.start()
    killed = False
    hard = seconds + GRACE
    while True:
        try:
            line = q.get(timeout=0.5)
            if line is None:
                break
            log(f"[{name} {time.monotonic() - t0:6.1f}s] {line}")
        except queue.Empty:
            pass
        if time.monotonic() - t0 > hard and proc.poll() is None and not killed:
            log(f"[{name}] time limit {hard:.0f}s reached: stopping the probe process (pid {proc.pid})")
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                time.sleep(5)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed = True
        if proc.poll() is not None and q.empty() and not th.is_alive():
            break
    proc.wait()
    dt = time.monotonic() - t0
    rec: dict
    if result_file.exists():
        rec = json.loads(result_file.read_text())
    else:
        partial = result_file.with_name(result_file.name + ".partial")
        rec = {
            "status": "timeout" if killed else "error",
            "error": f"killed after {dt:.0f}s" if killed else f"probe process exited with code {proc.returncode}",
        }
        if partial.exists():
            rec["result"] = json.loads(partial.read_text())
    rec["wall_seconds"] = dt
    rec.setdefault("seconds", dt)
    return rec


def run_inprocess(name: str, args, seconds: float, log: Log) -> dict:
    ctx = ProbeContext(out=args.out, device=args.device, quick=args.quick, deadline=time.monotonic() + seconds,
                       log=log, seed=args.seed)  # fmt: skip
    ctx.params = args.params_obj  # type: ignore[attr-defined]
    t0 = time.monotonic()
    try:
        res = probe_module(name).run(ctx)
        return {"status": "ok", "result": res, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exc()
        log(tb)
        return {"status": "error", "error": repr(e)[:1000], "traceback": tb[-8000:], "seconds": time.monotonic() - t0}


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m studies.probes.run", description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--probes", default=",".join(PROBES), help="comma-separated subset of " + ",".join(PROBES))
    ap.add_argument("--quick", action="store_true", help="tiny versions (tests)")
    ap.add_argument("--budget", type=float, default=320.0, help="seconds for env and all probes together")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=20251122)
    ap.add_argument("--params", default="{}", help="JSON dict of probe parameter overrides")
    ap.add_argument("--in-process", action="store_true", help="no child processes (debugging)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    return run_command("python -m studies.probes.run", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    """The run after its arguments are checked (bad ones end with one line, before any probe)."""
    args.params_obj = json_params(args.params)
    positive(args.budget, "--budget")
    args.out = writable_dir(args.out, "--out").resolve()
    if args.child:
        if args.child not in NAMES:
            raise UsageError(f"--child: expected one of {', '.join(NAMES)}, got {args.child!r}")
        return run_child(args.child, args.out, args.result_file, args.seconds, args.quick, args.device, args.seed,
                         args.params_obj)  # fmt: skip

    log = Log(args.out / "run.log")
    t_start = time.monotonic()
    names = sections(args.probes, PROBES, "--probes")
    res: dict = {
        "schema": SCHEMA,
        "started": _now(),
        "argv": sys.argv,
        "budget_seconds": args.budget,
        "quick": args.quick,
        "seed": args.seed,
        "env": {},
        "probes": {},
    }
    results_path = args.out / "results.json"
    write_json(results_path, res)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-probes-"))
    log(f"gpu probes: out={args.out} probes={names} budget={args.budget:.0f}s quick={args.quick}")

    def go(name: str, seconds: float) -> dict:
        log(f"=== {name}: up to {seconds:.0f}s ===")
        if args.in_process:
            return run_inprocess(name, args, seconds, log)
        return spawn(name, args, seconds, log, tmp)

    envrec = go("env", CAPS["env"][0])
    res["env"] = envrec.get("result") or {"error": envrec.get("error")}
    cuda_ok = bool(res["env"].get("cuda_available")) or args.device != "cuda"
    log(f"env: {json.dumps(res['env'].get('summary', res['env']))}")
    write_json(results_path, res)
    deadline = t_start + args.budget
    for i, name in enumerate(names):
        later = sum(CAPS[n][1] for n in names[i + 1 :])
        avail = deadline - time.monotonic() - later
        seconds = min(CAPS[name][0], avail)
        if not cuda_ok:
            rec = {"status": "skipped", "error": "no CUDA device", "seconds": 0.0}
        elif seconds < CAPS[name][1] / 2:
            rec = {"status": "skipped", "error": f"only {seconds:.0f}s left in the budget", "seconds": 0.0}
        else:
            rec = go(name, seconds)
        result = rec.get("result")
        if isinstance(result, dict):
            rec["summary"] = result.pop("summary", {}) or {}
        rec.setdefault("summary", {})
        res["probes"][name] = rec
        log(f"=== {name}: {rec['status']} in {rec.get('seconds', 0):.1f}s ===")
        if rec.get("error"):
            log(f"    error: {rec['error']}")
        write_json(results_path, res)
    res["finished"] = _now()
    res["total_seconds"] = time.monotonic() - t_start
    table = summary_table(res)
    res["summary_table"] = table
    write_json(results_path, res)
    for stray in args.out.glob("*.json.tmp"):  # left by an interrupted write_json
        stray.unlink()
    res["out_check"] = check_out_dir(args.out)
    problems = validate_results(res)
    res["schema_problems"] = problems
    write_json(results_path, res)
    log("")
    log(table)
    log("")
    for f, size in res["out_check"]["files"].items():
        log(f"  {f}: {size} bytes")
    for p in res["out_check"]["problems"] + problems:
        log(f"  WARNING: {p}")
    log(f"total {res['total_seconds']:.1f}s; results in {results_path}")
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
