"""Train the small GPT of `studies.training.model` on the standard library's source with one attention backend,
logging what Qiu & Yao's failure would show: loss curves, per layer the rate of repeated row maxima of the
attention scores and the spectral norms of W_Q and W_K; at the end a sample of per-layer q, k, v (and the
backend's O on them) for the emulator, score statistics, and the weights.

    PYTHONPATH=. python -m studies.training.train --attn paper --steps 3000 --out $OUT

Writes `OUT/NAME.json` (the log) and `OUT/NAME.npz` (`sample/*` and `model/*` as bf16 bits), NAME
the backend unless `--name` says otherwise.  On the CPU (`--device cpu`) every backend runs for smoke
tests; `ours` and `ours_fix` need `TRITON_INTERPRET=1` and `--dtype fp16` there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    import torch
except ImportError as exc:  # one line when run, an ImportError when imported, without the gpu extra
    from gpu.commands import missing_extra

    raise missing_extra("studies.training.train", __name__, exc, needs="torch") from None

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir

from . import data, stats
from .model import ATTENTION, GPT, PAPER_FILE, GPTConfig, loss_of

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SCHEDULES = ("constant", "cosine")
PROG = "python -m studies.training.train"


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser, schedule, batches and logging of one run."""

    steps: int = 3000
    batch: int = 32
    lr: float = 2e-3
    warmup: int = 200
    schedule: str = "constant"
    min_lr_ratio: float = 0.1  # cosine: the final learning rate over the peak
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    clip: float = 1.0
    log_every: int = 100
    val_windows: int = 64
    probe_windows: int = 8  # held-out windows the attention statistics are computed on
    seed: int = 0
    dtype: str = "bf16"
    seconds: float = math.inf  # stop training (not the final evaluation) after this long

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "log_every", "val_windows", "probe_windows"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{name}: expected a positive integer, got {x!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup: expected an integer >= 0, got {self.warmup!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("lr", "clip", "seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a positive number, got {getattr(self, name)!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio: expected a number in [0, 1], got {self.min_lr_ratio!r}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimiser step `step` (0-based): linear warm-up, then constant or cosine decay."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    low = cfg.lr * cfg.min_lr_ratio
    return low + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - low)


def optimizer(model: GPT, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (embeddings included), none on biases and LayerNorms (nanoGPT's)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def strict_json(obj):
    """`obj` with every NaN or infinite float replaced by None (JSON has no NaN; the log counts them)."""
    if isinstance(obj, float):
        return _finite_or_none(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def _bits(x: torch.Tensor) -> np.ndarray:
    """A bf16 or fp16 tensor's bits as uint16."""
    return x.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


class Evaluator:
    """Held-out loss and the attention statistics on fixed held-out windows."""

    def __init__(self, model: GPT, corpus: data.ByteCorpus, cfg: TrainConfig, device: torch.device):
        ctx = model.cfg.ctx
        val = torch.from_numpy(data.windows(corpus.val, data.fixed_starts(corpus.val.size, ctx, cfg.val_windows), ctx))
        self.val = val.to(device)
        self.probe = self.val[: cfg.probe_windows]
        self.model, self.cfg, self.device = model, cfg, device
        self.scale = 1.0 / math.sqrt(model.cfg.head_dim)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=DTYPES[self.cfg.dtype])

    @torch.no_grad()
    def val_loss(self) -> float:
        losses = []
        for i in range(0, self.val.shape[0], self.cfg.batch):
            w = self.val[i : i + self.cfg.batch]
            with self.autocast():
                losses.append(float(loss_of(self.model, w)) * w.shape[0])
        return sum(losses) / self.val.shape[0]

    @torch.no_grad()
    def captured(self) -> list[tuple[torch.Tensor, ...]]:
        """Per layer (q, k, v, o) on the probe windows, as the backend got and returned them."""
        attns = self.model.attentions()
        for a in attns:
            a.capture = True
        try:
            with self.autocast():
                self.model(self.probe[:, :-1])
            return [a.last for a in attns]
        finally:
            for a in attns:
                a.capture, a.last = False, None

    def attention_stats(self) -> dict:
        """Per layer: repeated-maxima rates (bf16 and fp32 scores) and the spectral norms of W_Q and W_K."""
        rates = {name: [] for name in (*stats.SCORE_DTYPES, "nonfinite")}
        for q, k, _, _ in self.captured():
            r = stats.repeated_max_rate(stats.scores(q, k, self.scale))
            for name in rates:
                rates[name].append(r[name])
        attns = self.model.attentions()
        return {
            "repeated_max": rates,
            "wq_norm": [stats.spectral_norm(a.w_q()) for a in attns],
            "wk_norm": [stats.spectral_norm(a.w_k()) for a in attns],
        }

    def final(self) -> tuple[list[dict], dict[str, np.ndarray]]:
        """Per-layer score summaries on the probe windows, and the sample: q, k, v and O of every layer and head
        of the first probe window, (layers, heads, N, head dim) as bits."""
        got = self.captured()
        summaries = [stats.score_summary(stats.scores(q, k, self.scale)) for q, k, _, _ in got]
        sample = {f"sample/{n}": np.stack([_bits(t[i][0]) for t in got]) for i, n in enumerate("qkvo")}
        sample["sample/tokens"] = self.probe[0].cpu().numpy()
        sample["sample/batch_heads"] = np.int64(self.probe.shape[0] * self.model.cfg.heads)
        sample["sample/dtype"] = np.array(self.cfg.dtype)
        return summaries, sample


def checkpoint(model: GPT) -> dict[str, np.ndarray]:
    """The weights rounded to bf16, as bits (`model/NAME`); the tied head is stored once, as `tok.weight`."""
    return {f"model/{k}": _bits(v.to(torch.bfloat16)) for k, v in model.state_dict().items() if k != "head.weight"}


def environment(device: torch.device) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device)}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["card"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def train(
    model_cfg: GPTConfig,
    cfg: TrainConfig,
    corpus: data.ByteCorpus,
    device: torch.device,
    paper_path: Path | None = None,
    progress=print,
) -> tuple[dict, dict[str, np.ndarray]]:
    """One run: (the log, the arrays of the .npz).  The same seed gives every backend the same initial weights
    (made on the CPU) and the same batches."""
    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg, paper_path).to(device)
    opt = optimizer(model, cfg)
    ev = Evaluator(model, corpus, cfg, device)
    train_bytes = torch.from_numpy(np.array(corpus.train)).to(device)  # a writable copy
    offsets = torch.arange(model_cfg.ctx + 1, device=device)
    rng = np.random.default_rng(cfg.seed)
    losses = torch.full((cfg.steps,), math.nan, device=device)
    gnorms = torch.full((cfg.steps,), math.nan, device=device)
    evals: list[dict] = []
    stopped, done, t0 = "steps", 0, time.time()

    def evaluate(step: int) -> None:
        done_losses = losses[:step].cpu().numpy()
        recent = done_losses[max(0, step - cfg.log_every) :]
        n_bad = int(sum(not torch.isfinite(p).all() for p in model.parameters()))
        rec = {
            "step": step,
            "seconds": round(time.time() - t0, 2),
            "train_loss": _finite_or_none(float(np.mean(recent))) if recent.size else None,
            "val_loss": _finite_or_none(ev.val_loss()),
            "nonfinite_params": n_bad,
            **ev.attention_stats(),
        }
        evals.append(rec)
        progress(
            f"{model_cfg.attn} step {step}: train {rec['train_loss']} val {rec['val_loss']} "
            f"rep-max bf16 {[round(x, 3) for x in rec['repeated_max']['bf16']]} "
            f"|W_Q| {[round(x, 2) for x in rec['wq_norm']]} ({rec['seconds']} s)"
        )

    model.train()
    evaluate(0)
    for step in range(cfg.steps):
        if time.time() - t0 > cfg.seconds:
            stopped = "time"
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        starts = torch.from_numpy(data.batch_starts(corpus.train.size, model_cfg.ctx, cfg.batch, rng)).to(device)
        window = train_bytes[starts[:, None] + offsets].long()
        with torch.autocast(device.type, dtype=DTYPES[cfg.dtype]):
            loss = loss_of(model, window)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        losses[step], gnorms[step] = loss.detach(), gnorm.detach()
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            evaluate(done)
            if not bool(torch.isfinite(losses[:done]).all() and torch.isfinite(gnorms[:done]).all()):
                stopped = "nonfinite"
                break
    if not evals or evals[-1]["step"] != done:
        evaluate(done)
    seconds = time.time() - t0
    summaries, sample = ev.final()
    loss_np, gn_np = losses[:done].cpu().numpy(), gnorms[:done].cpu().numpy()
    bad_loss, bad_gn = np.flatnonzero(~np.isfinite(loss_np)), np.flatnonzero(~np.isfinite(gn_np))
    log = {
        "attn": model_cfg.attn,
        "model": model_cfg.to_dict(),
        "train": asdict(cfg) | {"seconds": None if math.isinf(cfg.seconds) else cfg.seconds},
        "data": corpus.describe(),
        "env": environment(device),
        "nonfinite": {
            "loss_steps": int(bad_loss.size),
            "grad_norm_steps": int(bad_gn.size),
            "first_loss_step": int(bad_loss[0]) if bad_loss.size else None,
            "first_grad_norm_step": int(bad_gn[0]) if bad_gn.size else None,
        },
        "stopped": stopped,
        "steps_done": done,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(done * cfg.batch * model_cfg.ctx / seconds, 1),
        "max_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "loss": [_finite_or_none(round(float(x), 5)) for x in loss_np],
        "grad_norm": [_finite_or_none(round(float(x), 5)) for x in gn_np],
        "evals": evals,
        "scores": summaries,
    }
    return log, sample | checkpoint(model)


# ---- command line -----------------------------------------------------------------------------------
def _configs(args: argparse.Namespace) -> tuple[GPTConfig, TrainConfig]:
    try:
        model_cfg = GPTConfig(args.attn, args.layers, args.dim, args.heads, args.ctx)
        cfg = TrainConfig(
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            warmup=args.warmup,
            schedule=args.schedule,
            log_every=args.log_every,
            val_windows=args.val_windows,
            probe_windows=args.probe_windows,
            seed=args.seed,
            dtype=args.dtype,
            seconds=args.seconds,
        )
    except ValueError as exc:  # the dataclasses name the field first ("lr: expected ..."): name it as a flag
        field, _, why = str(exc).partition(": ")
        raise UsageError(f"--{field.replace('_', '-')}: {why}") from None
    if model_cfg.head_dim not in (64, 128, 256):
        raise UsageError(f"--dim/--heads: head dim {model_cfg.head_dim}; accepted: 64, 128, 256 (our kernels')")
    if args.attn.startswith("paper") and args.dtype != "bf16":
        raise UsageError(f"--dtype: the paper's pipeline is bf16, got {args.dtype}")
    return model_cfg, cfg


def run(args: argparse.Namespace) -> int:
    model_cfg, cfg = _configs(args)
    out = writable_dir(args.out, "--out")
    if args.device == "cuda":
        from gpu.commands import require_gpu

        require_gpu(PROG)
    elif args.attn.startswith("ours"):
        if importlib.util.find_spec("triton") is None:
            raise UsageError(
                f"--attn {args.attn}: our kernels need Triton, which is not installed (pip install "
                "'lowprec-attention[gpu]')"
            )
        from gpu.kernels.interpreter import INTERPRET

        if not INTERPRET or args.dtype != "fp16":
            raise UsageError(f"--attn {args.attn}: on the CPU needs TRITON_INTERPRET=1 and --dtype fp16")
    if args.attn.startswith("paper") and not (args.paper or PAPER_FILE).is_file():
        raise UsageError(f"--paper: Qiu & Yao's attention.py not found ({args.paper or 'default .upstream/'})")
    try:
        corpus = data.load_corpus(args.data_root, max_bytes=args.max_bytes)
    except ValueError as exc:
        raise UsageError(f"--data-root: {exc}") from None
    name = args.name or args.attn
    print(f"{PROG}: {name}: data {corpus.describe()}", flush=True)
    log, arrays = train(model_cfg, cfg, corpus, torch.device(args.device), args.paper, lambda s: print(s, flush=True))
    (out / f"{name}.json").write_text(json.dumps(strict_json(log), indent=1, allow_nan=False))
    np.savez_compressed(out / f"{name}.npz", **arrays)
    last = log["evals"][-1]
    print(
        f"{name}: {log['stopped']} after {log['steps_done']} steps, {log['seconds']} s, val {last['val_loss']}, "
        f"non-finite losses {log['nonfinite']['loss_steps']}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    d, t = GPTConfig(), TrainConfig()
    ap.add_argument("--attn", required=True, choices=ATTENTION, help="attention backend")
    ap.add_argument("--out", type=Path, required=True, help="folder for NAME.json and NAME.npz (created if missing)")
    ap.add_argument("--name", help="file stem (default: the backend)")
    ap.add_argument("--steps", type=int, default=t.steps, help=f"optimiser steps (default {t.steps})")
    ap.add_argument("--batch", type=int, default=t.batch, help=f"windows a step (default {t.batch})")
    ap.add_argument("--lr", type=float, default=t.lr, help=f"peak learning rate (default {t.lr})")
    ap.add_argument("--warmup", type=int, default=t.warmup, help=f"warm-up steps (default {t.warmup})")
    ap.add_argument("--schedule", choices=SCHEDULES, default=t.schedule, help=f"after warm-up (default {t.schedule})")
    ap.add_argument("--log-every", type=int, default=t.log_every, help=f"steps between evaluations ({t.log_every})")
    ap.add_argument("--val-windows", type=int, default=t.val_windows, help=f"held-out windows ({t.val_windows})")
    ap.add_argument("--probe-windows", type=int, default=t.probe_windows, help="held-out windows of the statistics")
    ap.add_argument("--seed", type=int, default=t.seed, help="weights and batches (default 0)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=t.dtype, help="autocast dtype (default bf16)")
    ap.add_argument("--seconds", type=float, default=math.inf, help="stop training after this long")
    ap.add_argument("--layers", type=int, default=d.layers, help=f"default {d.layers}")
    ap.add_argument("--dim", type=int, default=d.dim, help=f"default {d.dim}")
    ap.add_argument("--heads", type=int, default=d.heads, help=f"default {d.heads}")
    ap.add_argument("--ctx", type=int, default=d.ctx, help=f"context in bytes (default {d.ctx})")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="default cuda")
    ap.add_argument("--paper", type=Path, help="Qiu & Yao's attention.py (default .upstream/qiu_yao_attention.py)")
    ap.add_argument("--data-root", type=Path, help="folder of *.py (default: this Python's standard library)")
    ap.add_argument("--max-bytes", type=int, help="cap each split's bytes (small runs)")
    args = ap.parse_args(argv)
    return run_command(PROG, lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
