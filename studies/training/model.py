"""A small GPT (pre-LN, learned positions, byte vocabulary, tied embeddings) whose attention is pluggable.

Backends (`ATTENTION`), all causal with scale 1/sqrt(head dim):

- `paper`: Qiu & Yao's `attention.py` (their pure-PyTorch FlashAttention-2, 512x512 tiles, O accumulated
  in BF16), forward and hand-written backward both under bf16 autocast, as their compiled training step runs
  them (the `qiu_yao` policy models this); `paper_fix`: the same with their `STABLE=1` fix;
- `ours` / `ours_fix`: the project's Triton kernels (`gpu.flash.attention`), standard or stabilised
  softmax;
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, pinned to its flash backend on a GPU.

Each attention layer can keep its last q, k, v and O (`capture`) for the statistics and the sample.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION = ("paper", "paper_fix", "ours", "ours_fix", "sdpa")
#: the paper's attention.py, kept in the ignored folder .upstream/ (never committed)
PAPER_FILE = Path(__file__).resolve().parents[2] / ".upstream" / "qiu_yao_attention.py"
PAPER_TILE = 512  # their q_bucket_size = k_bucket_size


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model and its attention backend."""

    attn: str = "sdpa"
    layers: int = 6
    dim: int = 256
    heads: int = 4
    ctx: int = 512
    vocab: int = 256

    def __post_init__(self) -> None:
        if self.attn not in ATTENTION:
            raise ValueError(f"attn: expected one of {', '.join(ATTENTION)}, got {self.attn!r}")
        for name in ("layers", "dim", "heads", "ctx", "vocab"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{name}: expected a positive integer, got {x!r}")
        if self.dim % self.heads:
            raise ValueError(f"dim: {self.dim} is not a multiple of heads ({self.heads})")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def to_dict(self) -> dict:
        return asdict(self)


# ---- the paper's pipeline ---------------------------------------------------------------------------
class _Saved:
    """What their FlashAttentionFunction.forward is given as ctx: keeps what it saves for its backward."""

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors


class PaperAttention(torch.autograd.Function):
    """Their forward and hand-written backward, each called under bf16 autocast on q's device type (eager,
    their backward would not run: it multiplies an fp32 P by a bf16 dO); `stable` is their STABLE switch.

    What their forward saves goes through our ctx's `save_for_backward`: kept as a plain attribute, O (an
    output) would tie the graph to itself in a reference cycle and no step's activations would be freed."""

    @staticmethod
    def forward(ctx, q, k, v, module, stable: bool):
        os.environ["STABLE"] = "1" if stable else "0"  # their code reads it on every forward
        inner = _Saved()
        with torch.autocast(q.device.type, dtype=torch.bfloat16):
            o = module.FlashAttentionFunction.forward(inner, q, k, v, None, True, PAPER_TILE, PAPER_TILE)
        ctx.save_for_backward(*inner.saved_tensors)
        ctx.args, ctx.module = inner.args, module
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        inner = _Saved()
        inner.saved_tensors, inner.args = ctx.saved_tensors, ctx.args
        with torch.autocast(do.device.type, dtype=torch.bfloat16):
            dq, dk, dv = ctx.module.FlashAttentionFunction.backward(inner, do.contiguous())[:3]
        return dq, dk, dv, None, None


def load_paper(path: Path | None = None):
    """Qiu & Yao's attention.py as a module (`path` default: `PAPER_FILE`), loaded once per path."""
    path = Path(path) if path is not None else PAPER_FILE
    if not path.is_file():
        raise ValueError(f"paper: Qiu & Yao's attention.py not found at {str(path)!r} (kept in .upstream/)")
    return _load_paper(path.resolve())


@functools.lru_cache(maxsize=4)
def _load_paper(path: Path):
    from studies.device.record_kernels import load_paper as load

    return load(path)


def attention_fn(name: str, paper_path: Path | None = None) -> Callable[[torch.Tensor, ...], torch.Tensor]:
    """The causal attention `(q, k, v) -> o` of backend `name` for (B, H, N, d) tensors."""
    if name in ("paper", "paper_fix"):
        module, stable = load_paper(paper_path), name == "paper_fix"
        return lambda q, k, v: PaperAttention.apply(q, k, v, module, stable)
    if name in ("ours", "ours_fix"):
        from gpu import flash

        softmax = "stabilised" if name == "ours_fix" else "standard"
        return lambda q, k, v: flash.attention(q, k, v, causal=True, softmax=softmax)
    if name == "sdpa":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(q, k, v):
            if not q.is_cuda:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return sdpa
    raise ValueError(f"attn: expected one of {', '.join(ATTENTION)}, got {name!r}")


# ---- the model ----------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Multi-head causal self-attention through a backend; `capture` keeps the last q, k, v and the backend's
    output o (detached, (B, H, N, head dim) each)."""

    def __init__(self, cfg: GPTConfig, attend: Callable):
        super().__init__()
        self.heads, self.attend = cfg.heads, attend
        self.qkv, self.proj = nn.Linear(cfg.dim, 3 * cfg.dim), nn.Linear(cfg.dim, cfg.dim)
        self.capture = False
        self.last: tuple[torch.Tensor, ...] | None = None

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, N, head dim), contiguous, from the block's normalised input."""
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return tuple(t.contiguous() for t in qkv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        y = self.attend(q, k, v)
        if self.capture:
            self.last = (q.detach(), k.detach(), v.detach(), y.detach())
        return self.proj(y.transpose(1, 2).reshape(b, n, c))

    def w_q(self) -> torch.Tensor:
        """W_Q, (dim, dim): the first third of the fused projection's rows."""
        return self.qkv.weight[: self.qkv.in_features]

    def w_k(self) -> torch.Tensor:
        return self.qkv.weight[self.qkv.in_features : 2 * self.qkv.in_features]


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attend: Callable):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg, attend)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, pre-LN blocks, a final LayerNorm, the head tied to the token embedding."""

    def __init__(self, cfg: GPTConfig, paper_path: Path | None = None):
        super().__init__()
        self.cfg = cfg
        attend = attention_fn(cfg.attn, paper_path)
        self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.dim), nn.Embedding(cfg.ctx, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, attend) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        for blk in self.blocks:  # GPT-2's scaled init of the residual projections
            for w in (blk.attn.proj.weight, blk.mlp[2].weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * cfg.layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, N, vocab) for byte ids (B, N), N <= ctx."""
        n = idx.shape[1]
        if n > self.cfg.ctx:
            raise ValueError(f"idx: {n} positions, the model has {self.cfg.ctx}")
        x = self.tok(idx) + self.pos(torch.arange(n, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))

    def attentions(self) -> list[Attention]:
        return [blk.attn for blk in self.blocks]


def loss_of(model: GPT, window: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy (nats, float32) of (B, N + 1) windows."""
    logits = model(window[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
