"""Other people's attention kernels, recorded on the GPU: the grid of fresh cases, inputs by seed, and the
recorded outputs as kernel runs checked against a policy.

Kernels: `tutorial` (Triton's fused-attention tutorial, fp16, N a multiple of 128), PyTorch SDPA's
`sdpa_flash`, `sdpa_efficient` and `sdpa_cudnn` backends, and `paper` (Qiu & Yao's pure-PyTorch
attention, eager under CUDA bf16 autocast, fix off and on).  Inputs come from
`make_inputs()` (every kind: ties at the max, near-ties, sinks, large and tiny
magnitudes, negative-mean V) with seeds no other recording uses; `studies/device/record_kernels.py` records
them (O, LSE, and the tutorial's dQ, dK, dV); a recording folder holds `others.json`, `others.npz` and
`others_bwd.npz`.  The repository keeps a subset compactly (`python -m tools.keep_others`: others.json with the
SHA-256 of every output, `flashsim.recording`; others.npz only the patches of outputs the emulator does not
reproduce): tests/data/others and the folders beside it.  numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from flashsim.crosscheck import KernelRun
from flashsim.inputs import ALL_KINDS, make_inputs
from flashsim.policy import PolicyRef
from flashsim.recording import RecordedRun, Recording
from flashsim.registry import Registry
from flashsim.softmax import SoftmaxVariant, get_softmax

from .kernels import sdpa_policy

SEED0 = 910_000  # no other recording draws seeds from here on


@dataclass(frozen=True)
class RecordedKernel:
    """A kernel the grid records: its block of seeds (100,000 wide), the grid's defaults, and the policy a run of
    it is checked against (``policy(case, config, deterministic)``: ``config`` the autotuner's choice, where the
    recording kept one)."""

    name: str
    seed_block: int
    policy: Callable[[KernelCase, dict | None, bool], PolicyRef]
    lengths: tuple[int, ...] = (128, 200)
    dtypes: tuple[str, ...] = ("bf16", "fp16")
    softmaxes: tuple[str, ...] = ("standard",)
    seeds_per_cell: int = 1


RECORDED: Registry[RecordedKernel] = Registry("recorded kernel", RecordedKernel)
"""The kernels `grid()` and `policy_of()` know; any other name (a user's kernel) is checked against ``fa2`` and
draws seeds from block 4."""


@dataclass(frozen=True)
class KernelCase:
    """One head of one kernel's launch: q, k, v of (n, d) drawn by `kind` from `seed`; `softmax` the
    variant the kernel ran (the paper's pipeline: `standard` or its fix, `stabilised`)."""

    kernel: str
    n: int
    d: int
    dtype: str
    causal: bool
    kind: str
    seed: int
    softmax: str = "standard"

    @property
    def key(self) -> str:
        mask = "causal" if self.causal else "full"
        fix = "" if self.softmax == "standard" else f"_{self.softmax}"
        return f"{self.kernel}_{self.dtype}_d{self.d}_n{self.n}_{mask}_{self.kind}{fix}_s{self.seed}"

    def softmax_variant(self) -> SoftmaxVariant:
        """The variant as flashsim names it; the paper's fix counts masked entries as their code does."""
        if self.kernel == "paper" and self.softmax == "stabilised":
            return get_softmax("stabilised", count_masked=True)
        return get_softmax(self.softmax)

    def inputs(self) -> dict[str, np.ndarray]:
        """q, k, v, do as float32 arrays of dtype values, (n, d) each."""
        return make_inputs(self.kind, self.n, self.n, self.d, self.dtype, self.seed)

    def to_dict(self) -> dict:
        return asdict(self)


def grid(
    kernel: str, lengths: tuple[int, ...] | None = None, seeds_per_cell: int | None = None, round_: int = 0
) -> list[KernelCase]:
    """Every kind x head dim (64, 128) x causal x length x dtype (x softmax) x `seeds_per_cell` seeds of
    `kernel`: 112 cases by default.

    The tutorial runs fp16 at lengths that are multiples of 128 (its own limits), two seeds a cell; the
    paper's pipeline bf16 at 200 and 640 (one and two of its 512-key tiles), fix off and on; SDPA's
    backends, and any other kernel name (a user's kernel, `python -m gpu.crosscheck --kernel`), bf16 and
    fp16 with one ragged length, one seed a cell.  Each name of `KERNELS` draws seeds of its own, and
    each recording `round_` fresh ones (10,000 apart)."""
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ < 10:
        raise ValueError(f"round_: expected an integer 0..9, got {round_!r}")
    spec = recorded_kernel(kernel)
    seeds_per_cell = seeds_per_cell or spec.seeds_per_cell
    cases, seed = [], SEED0 + 100_000 * spec.seed_block + 10_000 * round_
    for dtype in spec.dtypes:
        for d in (64, 128):
            for causal in (False, True):
                for n in lengths or spec.lengths:
                    for softmax in spec.softmaxes:
                        for kind in ALL_KINDS:
                            for _ in range(seeds_per_cell):
                                cases.append(KernelCase(kernel, n, d, dtype, causal, kind, seed, softmax))
                                seed += 1
    return cases


def recorded_kernel(name: str) -> RecordedKernel:
    """The registered kernel of that name, or for any other name a user's kernel checked against ``fa2``."""
    return RECORDED.get(name) if name in RECORDED else RecordedKernel(name, 4, _fa2_policy)


def policy_of(case: KernelCase, config: dict | None = None, deterministic: bool = False) -> PolicyRef:
    """The policy a kernel's run is checked against (`RecordedKernel.policy`).
    `deterministic`: the run was recorded under `torch.use_deterministic_algorithms(True)`."""
    return recorded_kernel(case.kernel).policy(case, config, deterministic)


def _tutorial_policy(case: KernelCase, config: dict | None, deterministic: bool) -> PolicyRef:
    """The tutorial's policy for the tiles its autotuner chose."""
    cfg = config or {}
    tiles = {
        "block_m": cfg.get("BLOCK_M", 128),
        "block_n": cfg.get("BLOCK_N", 64),
        "num_warps": cfg.get("num_warps", 4),
    }
    return PolicyRef("gpu.policies:tutorial_policy", {k: int(v) for k, v in tiles.items()})


def _sdpa_policy(case: KernelCase, config: dict | None, deterministic: bool) -> PolicyRef:
    """SDPA's backend for one head of n keys on the recording's card (132 SMs): `sdpa_policy()`."""
    launch = {"dtype": case.dtype, "head_dim": case.d, "n_q": case.n, "n_k": case.n, "batch_heads": 1}
    return sdpa_policy(case.kernel.removeprefix("sdpa_"), launch | {"deterministic": deterministic})


def _fa2_policy(case: KernelCase, config: dict | None, deterministic: bool) -> PolicyRef:
    return PolicyRef("fa2")


def _paper_policy(case: KernelCase, config: dict | None, deterministic: bool) -> PolicyRef:
    return PolicyRef("qiu_yao")


for _kernel in (
    RecordedKernel("tutorial", 0, _tutorial_policy, lengths=(128, 256), dtypes=("fp16",), seeds_per_cell=2),
    RecordedKernel("sdpa_flash", 1, _sdpa_policy),
    RecordedKernel("sdpa_efficient", 2, _sdpa_policy),
    RecordedKernel("sdpa_cudnn", 3, _sdpa_policy),
    RecordedKernel(
        "paper", 5, _paper_policy, lengths=(200, 640), dtypes=("bf16",), softmaxes=("standard", "stabilised")
    ),
):
    RECORDED.register(_kernel)
KERNELS = tuple(RECORDED.names())
"""The registered kernels' names (a device recording's ``--kernels``)."""


def load(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(others.json, the arrays of others.npz and, where present, others_bwd*.npz) of a recording folder as
    studies/device/record_kernels.py writes it (the outputs' bits); a compact folder (`recording()`) is refused."""
    meta_path, arr_path = Path(folder) / "others.json", Path(folder) / "others.npz"
    for p in (meta_path, arr_path):
        if not p.is_file():
            raise FileNotFoundError(f"others: {p} is missing (record with studies/device/record_kernels.py)")
    meta = json.loads(meta_path.read_text())
    if "digests" in meta:
        raise ValueError(f"others: {folder} is kept compactly (digests, not bits): read it with others.recording()")
    arrays = {}
    for path in (arr_path, *sorted(Path(folder).glob("others_bwd*.npz"))):
        if path.is_file():
            with np.load(path) as z:
                arrays.update({k: z[k] for k in z.files})
    return meta, arrays


def recording(folder: Path) -> Recording:
    """A recording folder as a `Recording`: the kept copy (others.json with the digests
    of every output, others.npz with the patches where the emulator differs), or a device folder (`load()`:
    every output's bits kept)."""
    meta_path = Path(folder) / "others.json"
    if meta_path.is_file() and "digests" in json.loads(meta_path.read_text()):
        return Recording.load(meta_path)
    meta, arrays = load(folder)
    return Recording.of_arrays(meta, arrays, keep=list(arrays))


def run_of(rec: dict, arrays: dict[str, np.ndarray], deterministic: bool = False) -> KernelRun | None:
    """One recorded case (an entry of others.json) with its outputs' bits (`arrays`, `load()`) as a kernel
    run with the policy of its launch: O and LSE, and dQ, dK, dV where they were recorded (the tutorial's causal
    cases: its backward always masks causally; SDPA's backends in later recordings); None when its outputs are
    not in `arrays`."""
    case = KernelCase(**rec["case"])
    if f"{case.key}/o" not in arrays:
        return None
    x = case.inputs()
    outputs = {"o": arrays[f"{case.key}/o"][None], "lse": arrays[f"{case.key}/lse"].reshape(1, -1)}
    grads = all(f"{case.key}/{g}" in arrays for g in ("dq", "dk", "dv"))
    outputs.update({g: arrays[f"{case.key}/{g}"][None] for g in ("dq", "dk", "dv")} if grads else {})
    return KernelRun(
        q=x["q"][None],
        k=x["k"][None],
        v=x["v"][None],
        do=x["do"][None] if grads else None,
        dtype=case.dtype,
        causal=case.causal,
        sm_scale=float(rec["sm_scale"]),
        softmax=case.softmax_variant(),
        policy=policy_of(case, rec.get("config"), deterministic),
        outputs=outputs,
        note=case.key,
    )


def recorded_run_of(rec: dict, recorded: Recording, deterministic: bool = False) -> RecordedRun | None:
    """One recorded case (an entry of others.json) as a `RecordedRun` of `recorded`
    (`recording()`), with the policy of its launch: O and LSE, and dQ, dK, dV where they were recorded;
    None when its outputs are not in the recording."""
    case = KernelCase(**rec["case"])
    if f"{case.key}/o" not in recorded:
        return None
    grads = all(f"{case.key}/{g}" in recorded for g in ("dq", "dk", "dv"))
    names = ("o", "lse") + (("dq", "dk", "dv") if grads else ())
    x = case.inputs()
    return RecordedRun.build(
        recorded,
        {n: f"{case.key}/{n}" for n in names},
        x["q"][None],
        x["k"][None],
        x["v"][None],
        x["do"][None] if grads else None,
        dtype=case.dtype,
        causal=case.causal,
        sm_scale=float(rec["sm_scale"]),
        softmax=case.softmax_variant(),
        policy=policy_of(case, rec.get("config"), deterministic),
        note=case.key,
    )


def runs(folder: Path, kernel: str | None = None) -> list[KernelRun]:
    """The runs of a device recording folder (of one kernel, when given) with their outputs' bits (`run_of()`)."""
    meta, arrays = load(folder)
    recs = [rec for rec in meta["cases"] if kernel is None or rec["case"]["kernel"] == kernel]
    det = bool(meta.get("deterministic", False))
    return [run for run in (run_of(rec, arrays, det) for rec in recs) if run is not None]


def recorded_runs(folder: Path, kernel: str | None = None) -> list[RecordedRun]:
    """The recorded runs of a folder, kept compactly or not (of one kernel, when given; `recorded_run_of()`)."""
    rec = recording(folder)
    cases = [c for c in rec.meta["cases"] if kernel is None or c["case"]["kernel"] == kernel]
    det = bool(rec.meta.get("deterministic", False))
    return [run for run in (recorded_run_of(c, rec, det) for c in cases) if run is not None]


__all__ = [
    "KERNELS",
    "RECORDED",
    "KernelCase",
    "RecordedKernel",
    "grid",
    "load",
    "policy_of",
    "recorded_kernel",
    "recorded_run_of",
    "recorded_runs",
    "recording",
    "run_of",
    "runs",
]
