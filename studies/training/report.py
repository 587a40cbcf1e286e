"""Plots and tables of the training runs (`studies.training.train` logs) and the emulator's lean of O on their
samples (`studies.training.lean`), for docs/training.md.  CPU only; matplotlib for the plots.

    PYTHONPATH=. python -m studies.training.report --runs out/train --lean studies/training/data/lean.json --img
    docs/img \
        --family flashsim/data/trained_attention.npz

`--runs`: a folder of NAME.json logs and, for the lean, NAME.npz samples (without them the lean is read
back from `--lean` rather than computed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from flashsim.analysis.stats import summary_table
from flashsim.console import ArgumentParser, UsageError, run_command

from . import lean

#: runs in the order of the plots and tables, with their line styles
RUNS = {
    "paper": ("tab:red", "-"),
    "paper_seed1": ("tab:red", ":"),
    "paper_fix": ("tab:orange", "-"),
    "ours": ("tab:blue", "-"),
    "ours_fix": ("tab:cyan", "-"),
    "sdpa": ("black", "-"),
    "sdpa_seed1": ("black", ":"),
}
STATISTICS = ("signed", "away", "away_ties")  # each a table of its own, Holm-corrected within it


def load_logs(folder: Path) -> dict[str, dict]:
    """The logs of `RUNS` present in `folder`."""
    logs = {
        n: json.loads((Path(folder) / f"{n}.json").read_text()) for n in RUNS if (Path(folder) / f"{n}.json").is_file()
    }
    if not logs:
        raise UsageError(f"--runs: no training log ({', '.join(RUNS)}.json) in {folder}")
    return logs


def binned(values: list, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin end steps, means) of per-step values over bins of `width` steps; a bin holding a non-finite
    value (None in the log) is NaN, not averaged over."""
    x = np.array([np.nan if v is None else v for v in values], np.float64)
    n = x.size // width
    if n == 0:
        return np.zeros(0), np.zeros(0)
    return np.arange(1, n + 1) * width, x[: n * width].reshape(n, width).mean(axis=1)


def _curve(log: dict, key: str, layer: int | None = None, sub: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    steps, ys = [], []
    for e in log["evals"]:
        v = e[key] if sub is None else e[key][sub]
        v = v if layer is None else v[layer]
        steps.append(e["step"])
        ys.append(np.nan if v is None else v)
    return np.array(steps), np.array(ys, np.float64)


def plot_losses(logs: dict[str, dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))
    base = dict(zip(*_curve(logs["sdpa"], "val_loss"), strict=True)) if "sdpa" in logs else {}
    for name, log in logs.items():
        color, style = RUNS[name]
        s, y = binned(log["loss"], 50)
        a.plot(s, y, color=color, ls=style, lw=1, label=f"{name} (train, 50-step means)")
        s, y = _curve(log, "val_loss")
        b.plot(s, y, color=color, ls=style, lw=1.2, marker=".", ms=3, label=name)
        keep = [i for i, st in enumerate(s) if st in base and st % 100 == 0 and st >= 500]
        if name != "sdpa" and keep:
            c.plot(s[keep], y[keep] - np.array([base[st] for st in s[keep]]), color=color, ls=style, lw=1, label=name)
    c.axhline(0, color="gray", lw=0.8)
    c.set_title("held-out loss minus sdpa's (seed 0)")
    c.set_xlabel("step")
    c.set_ylabel("nats per byte")
    c.grid(alpha=0.3)
    for ax, title in ((a, "training loss"), (b, "held-out loss")):
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("nats per byte")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    b.set_ylim(0.75, 1.6)
    b.set_xlim(500, None)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_layers(logs: dict[str, dict], path: Path, key: str, sub: str | None, ylabel: str) -> None:
    """One panel per layer: `key` (`sub`) of every run over training."""
    import matplotlib.pyplot as plt

    first = next(iter(logs.values()))["evals"][0][key]
    layers = len(first if sub is None else first[sub])
    cols = 3
    rows = math.ceil(layers / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.2 * rows), sharex=True)
    for i, ax in enumerate(np.ravel(axes)):
        if i >= layers:
            ax.axis("off")
            continue
        for name, log in logs.items():
            color, style = RUNS[name]
            s, y = _curve(log, key, i, sub)
            ax.plot(s, y, color=color, ls=style, lw=1, label=name)
        ax.set_title(f"layer {i}")
        ax.grid(alpha=0.3)
        ax.set_ylabel(ylabel)
    np.ravel(axes)[0].legend(fontsize=7)
    for ax in np.ravel(axes)[-cols:]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compute_lean(folder: Path, names: list[str], progress=print) -> dict:
    """Per run and layer: the emulator's errors of O summarized (`lean.summaries`), the fraction of O
    bit-identical to the GPU's, the non-finite count, and the policy used."""
    out: dict = {"margin": lean.MARGIN, "runs": {}}
    for name in names:
        sample = lean.load_sample(Path(folder) / f"{name}.npz", name)
        _, _, n, d = sample.shape
        policy, softmax = lean.policy_of(name, n, d, sample.batch_heads)
        layers = []
        for layer in range(sample.shape[0]):
            errs = lean.layer_errors(sample, layer, policy, softmax, compare=True)
            s = lean.summaries(errs)
            layers.append(
                {
                    "layer": layer,
                    "identical": errs.identical,
                    "nonfinite": errs.nonfinite,
                    "tie_rows": int(np.count_nonzero(errs.ties >= 2)),
                    **{k: v.to_dict() for k, v in s.items()},
                }
            )
            progress(f"lean: {name} layer {layer}: identical {errs.identical:.6f}, signed {s['signed'].mean:+.2e}")
        out["runs"][name] = {"policy": policy.name, "softmax": softmax.name, "layers": layers}
    return out


def _summary(d: dict):
    from flashsim.analysis.stats import Summary

    return Summary(**{k: (math.nan if v is None else v) for k, v in d.items()})


def lean_tables(result: dict, method: str = "holm") -> dict[str, list[dict]]:
    """Per statistic of `STATISTICS`, the table of every run and layer with corrected p-values and
    verdicts (flashsim.analysis.stats.summary_table; one family per statistic)."""
    tables = {}
    for stat in STATISTICS:
        rows = [
            ({"run": name, "layer": rec["layer"], "identical": rec["identical"]}, _summary(rec[stat]))
            for name, run in result["runs"].items()
            for rec in run["layers"]
        ]
        tables[stat] = summary_table(rows, method)
    return tables


def _e(x: float) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:+.1e}"


def _p(x: float) -> str:
    return "–" if x is None or not math.isfinite(x) else (f"{x:.0e}" if x < 1e-2 else f"{x:.2f}")


def markdown(table: list[dict]) -> str:
    """A markdown table of one statistic's rows."""
    head = (
        "| run | layer | O = GPU's | rows | mean [95% CI] | mean ulps | sign p | mean \\|e\\| | Holm p (t) | verdict |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(
            f"| {r['run']} | {r['layer']} | {r['identical']:.4%} | {r['n']} | "
            f"{_e(r['mean'])} [{_e(r['ci_low'])}, {_e(r['ci_high'])}] | "
            f"{_e(r['mean_ulps'])} | {_p(r['sign_p'])} | {r['mean_abs']:.1e} | {_p(r['t_p_adjusted'])} | "
            f"{r['verdict']} |"
        )
    return "\n".join(lines)


def compact_markdown(tables: dict[str, list[dict]]) -> str:
    """One row per run and layer: the three statistics' means with their intervals and verdicts side by side."""
    short = {"equivalent to 0 within ±margin": "equivalent", "leans negative": "leans −", "leans positive": "leans +"}
    head = (
        "| run | layer | O = GPU's | signed: mean [95% CI] | verdict | away from 0: mean [95% CI] | sign p | verdict "
        "| tie rows | away, tie rows: mean [95% CI] | verdict |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, b, c in zip(*(tables[k] for k in STATISTICS), strict=True):
        cells = [f"{r['run']}", f"{r['layer']}", f"{r['identical']:.2%}"] if (r := a) else []
        for t, extra in ((a, False), (b, True), (c, False)):
            if t is c:
                cells.append(str(t["n"]))
            cells.append(f"{_e(t['mean'])} [{_e(t['ci_low'])}, {_e(t['ci_high'])}]")
            if extra:
                cells.append(_p(t["sign_p"]))
            cells.append(short.get(t["verdict"], t["verdict"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_summary(logs: dict[str, dict], at: int = 3800) -> str:
    """A markdown table per run: card, steps, time, throughput, held-out loss at a few steps, W_Q norms."""
    head = (
        "| run | card | steps (stopped by) | s | tokens/s | val 1000 | val 2000 | val {at} | final val | "
        "max W_Q norm at {at} (layer) | non-finite |"
    )
    lines = [head.format(at=at), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, log in logs.items():
        ev = {e["step"]: e for e in log["evals"]}
        wq = ev[at]["wq_norm"] if at in ev else None
        nf = log["nonfinite"]
        lines.append(
            f"| {name} | {log['env'].get('card', log['env']['device'])} | {log['steps_done']} ({log['stopped']}) | "
            f"{log['seconds']:.0f} | {log['tokens_per_second']:.0f} | "
            + " | ".join(f"{ev[s]['val_loss']:.4f}" if s in ev else "–" for s in (1000, 2000, at))
            + f" | {log['evals'][-1]['val_loss']:.4f} | "
            + (f"{max(wq):.2f} ({int(np.argmax(wq))})" if wq else "–")
            + f" | {nf['loss_steps']} losses, {nf['grad_norm_steps']} grad norms |"
        )
    return "\n".join(lines)


def write_family(folder: Path, run: str, out: Path) -> None:
    """The sample of `run` as the data of a `trained` input family (issue 32): q, k, v bits (layers,
    heads, N, d), the scale, the window's bytes, and in `meta` (JSON) the run's model, data, card and
    per-layer score summaries."""
    log = json.loads((Path(folder) / f"{run}.json").read_text())
    with np.load(Path(folder) / f"{run}.npz") as z:
        arrays = {n: z[f"sample/{n}"] for n in "qkv"}
        tokens = z["sample/tokens"]
    meta = {
        "run": run,
        "what": "q, k, v of every layer and head of one held-out window (bf16 bits, (layers, heads, N, d)), "
        "causal self-attention with sm_scale = 1/sqrt(d), from studies.training.train",
        "model": log["model"],
        "train": log["train"],
        "data": log["data"],
        "env": log["env"],
        "steps_done": log["steps_done"],
        "scores": log["scores"],
    }
    d = arrays["q"].shape[-1]
    np.savez_compressed(out, **arrays, tokens=tokens, sm_scale=np.float64(1 / math.sqrt(d)), meta=json.dumps(meta))


# ---- command line -----------------------------------------------------------------------------------
def run(args) -> int:
    if not Path(args.lean).parent.is_dir():
        raise UsageError(f"--lean: the folder {Path(args.lean).parent} does not exist")
    logs = load_logs(args.runs)
    names = [n for n in logs if (Path(args.runs) / f"{n}.npz").is_file()]
    if names:
        result = compute_lean(args.runs, names)
        Path(args.lean).write_text(json.dumps(result, indent=1, allow_nan=False))
    elif Path(args.lean).is_file():
        result = json.loads(Path(args.lean).read_text())
    else:
        raise UsageError(f"--runs: no samples (NAME.npz) in {args.runs} and no --lean file {args.lean}")
    if args.family:
        write_family(args.runs, "sdpa", args.family)
    if args.img:
        img = Path(args.img)
        img.mkdir(parents=True, exist_ok=True)
        plot_losses(logs, img / "training_loss.png")
        plot_layers(logs, img / "training_repeated_maxima.png", "repeated_max", "bf16", "rows with repeated max")
        plot_layers(logs, img / "training_wq_norm.png", "wq_norm", None, "spectral norm of W_Q")
    print(run_summary(logs))
    tables = lean_tables(result)
    print(f"\ncompact (margin {result['margin']:g}; Holm within each statistic)\n{compact_markdown(tables)}")
    for stat, table in tables.items():
        print(f"\n{stat} (margin {result['margin']:g}; {table[0]['correction'] if table else ''})\n{markdown(table)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    prog = "python -m studies.training.report"
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="folder of NAME.json logs (and NAME.npz samples)")
    ap.add_argument("--lean", type=Path, required=True, help="JSON of the lean results (written if samples are there)")
    ap.add_argument("--img", type=Path, help="folder for training_*.png (none: no plots)")
    ap.add_argument("--family", type=Path, help="write the sdpa run's sample here as a trained-family file")
    args = ap.parse_args(argv)
    return run_command(prog, lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
