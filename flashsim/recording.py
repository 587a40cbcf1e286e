"""Compact recordings of what a device computed: the SHA-256 of each output's bits, the bits only where kept.

A recording is a JSON file, ``NAME.json``: what the device script wrote about its run (cases, seeds, command,
card, versions), a ``"recording"`` entry (`FORMAT`, the device command that re-records it, what is
kept) and under ``"digests"`` one line per recorded array, ``"DTYPE SHAPE SHA256"`` (e.g.
``"uint16 1x1x333x64 9f86d0..."``): the SHA-256 of the array's bytes in C order, little-endian.  Inputs
that a seed regenerates are digested too, so that a check can first prove it regenerated them.  Beside it,
``NAME.npz`` (optional, compressed) holds

- under an array's own key, the few arrays kept whole (those a diagnosis needs: NaN encodings, the per-block
  intermediates of a first-divergence test, inputs that no seed regenerates);
- under ``patch/<key>/index`` and ``patch/<key>/bits``, for an output the emulator does not reproduce, the
  elements where the device's bits differ from the emulator's (flat indices and the device's bits): the
  device's bits are then the emulator's output with those elements replaced, and the digest proves it.

A check recomputes the emulator's output, hashes it and compares with the digest (`matches()`,
`verify()`); where a test needs the device's bits themselves (to count how many elements a
changed model gets wrong), `bits()` gives them: kept, or the emulator's output (patched) once
its digest matches.  `RecordedRun` is a kernel run (`KernelRun`) recorded
this way.  numpy only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .bounds import AttentionCheck, check_attention
from .crosscheck import KernelRun, OutputCheck, check_bits, emulate, from_bits, stored_formats
from .policy import Policy, PolicyRef
from .softmax import SoftmaxVariant
from .trust import AllowImport

FORMAT = "lowprec-recording/1"
RECORDS_DOC = "docs/crosscheck.md, 'Recordings'"  # where the device commands are listed


class RecordingMismatch(AssertionError):
    """Bits that should be the recorded ones are not (their SHA-256 differs from the recording's digest)."""


def sha256_of(bits: np.ndarray) -> str:
    """The SHA-256 (hex) of an array's bytes, C order, little-endian."""
    a = np.asarray(bits)
    return hashlib.sha256(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()).hexdigest()


def _dtype_name(dtype: np.dtype) -> str:
    """A dtype as a digest names it: numpy's name for numbers ('uint16'), its code otherwise ('<U16')."""
    return dtype.name if dtype.kind in "biuf" else dtype.str


@dataclass(frozen=True)
class Digest:
    """The fingerprint of a recorded array: its dtype, its shape and the SHA-256 of its bytes."""

    sha256: str
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, bits: np.ndarray) -> Digest:
        a = np.asarray(bits)
        return cls(sha256_of(a), _dtype_name(a.dtype), tuple(int(n) for n in a.shape))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def matches(self, bits: np.ndarray) -> bool:
        """Whether ``bits`` are the recorded array: the same dtype and number of elements (any shape: a run may
        drop a batch axis) and the same bytes."""
        a = np.asarray(bits)
        return _dtype_name(a.dtype) == self.dtype and a.size == self.size and sha256_of(a) == self.sha256

    def __str__(self) -> str:
        return f"{self.dtype} {'x'.join(map(str, self.shape)) or 'scalar'} {self.sha256}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        """The inverse of ``str``."""
        try:
            dtype, shape, sha = text.split(" ")
            np.dtype(dtype)
            dims = () if shape == "scalar" else tuple(int(n) for n in shape.split("x"))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"digest: expected 'DTYPE SHAPE SHA256', got {text!r} ({exc})") from None
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"digest: expected a SHA-256 in hex, got {sha!r}")
        return cls(sha, dtype, dims)


@dataclass(frozen=True)
class Patch:
    """Where the device's bits differ from the emulator's: flat indices and the device's bits there."""

    index: np.ndarray
    bits: np.ndarray

    @classmethod
    def between(cls, emulated: np.ndarray, device: np.ndarray) -> Patch:
        e, d = np.asarray(emulated).reshape(-1), np.asarray(device).reshape(-1)
        idx = np.flatnonzero(e != d)
        return cls(idx.astype(np.uint32 if d.size < 2**32 else np.uint64), d[idx])

    def apply(self, emulated: np.ndarray) -> np.ndarray:
        """The emulator's output with the device's bits put back where they differ (a new array)."""
        out = np.array(emulated, copy=True)
        out.reshape(-1)[self.index.astype(np.int64)] = self.bits
        return out

    def __len__(self) -> int:
        return int(self.index.size)


def _message(source: str, key: str, want: Digest, got: np.ndarray, command: str, what: str = "emulated") -> str:
    a = np.asarray(got)
    return (
        f"{source}: {key}: the {what} bits ({_dtype_name(a.dtype)} {'x'.join(map(str, a.shape))}, SHA-256 "
        f"{sha256_of(a)[:16]}...) are not the recorded ones ({want.dtype} {'x'.join(map(str, want.shape))}, SHA-256 "
        f"{want.sha256[:16]}...). The recording keeps digests, not bits: to see which elements differ, re-record "
        f"the full bits on a GPU machine with `{command}` ({RECORDS_DOC}) and compare them there"
    )


@dataclass
class Recording:
    """One recording: ``meta`` (the JSON but its digests), the digest of every recorded array by key, the
    arrays kept whole and the patches of outputs the emulator does not reproduce (by key)."""

    meta: dict
    digests: dict[str, Digest]
    kept: dict[str, np.ndarray] = field(default_factory=dict)
    patches: dict[str, Patch] = field(default_factory=dict)
    path: Path | None = None

    # ---- files -----------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """``NAME.json`` and, where present, ``NAME.npz``; the kept arrays are checked against their digests."""
        path = Path(path)
        if path.suffix != ".json":
            path = path.with_name(path.name + ".json")
        meta = json.loads(path.read_text())
        if "digests" not in meta:
            raise ValueError(f"recording: {path} has no 'digests' (not a compact recording; {RECORDS_DOC})")
        digests = {k: Digest.parse(v) for k, v in meta.pop("digests").items()}
        kept, patches = {}, {}
        bits_path = path.with_suffix(".npz")
        if bits_path.is_file():
            with np.load(bits_path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            for k, a in arrays.items():
                if k.startswith("patch/") and k.endswith("/index"):
                    key = k[len("patch/") : -len("/index")]
                    patches[key] = Patch(a, arrays[f"patch/{key}/bits"])
                elif not k.startswith("patch/"):
                    kept[k] = a
        rec = cls(meta, digests, kept, patches, path)
        for k, a in kept.items():
            if k not in digests:
                raise ValueError(f"recording: {bits_path} keeps {k!r}, which {path.name} has no digest of")
            if not digests[k].matches(a) or a.shape != digests[k].shape:
                raise RecordingMismatch(_message(str(bits_path), k, digests[k], a, rec.command, "kept"))
        return rec

    def save(self, path: str | Path | None = None) -> Path:
        """Write ``NAME.json`` (the digests one a line) and, if anything is kept or patched, ``NAME.npz``
        (removed otherwise); returns the JSON's path."""
        path = Path(path or self.path)
        if path.suffix != ".json":
            path = path.with_name(path.name + ".json")
        path.write_text(dumps(self.meta | {"digests": {k: str(d) for k, d in self.digests.items()}}) + "\n")
        arrays = dict(self.kept)
        for k, p in self.patches.items():
            arrays[f"patch/{k}/index"] = p.index
            arrays[f"patch/{k}/bits"] = p.bits
        bits_path = path.with_suffix(".npz")
        if arrays:
            np.savez_compressed(bits_path, **arrays)
        elif bits_path.exists():
            bits_path.unlink()
        self.path = path
        return path

    @classmethod
    def of_arrays(
        cls,
        meta: dict,
        arrays: dict[str, np.ndarray],
        keep: tuple[str, ...] | list[str] = (),
        patches: dict[str, Patch] | None = None,
    ) -> Recording:
        """A recording of ``arrays`` (every one digested), keeping the arrays named in ``keep`` whole."""
        missing = [k for k in keep if k not in arrays]
        if missing:
            raise ValueError(f"keep: no arrays {missing[:5]}")
        return cls(
            dict(meta), {k: Digest.of(a) for k, a in arrays.items()}, {k: arrays[k] for k in keep}, dict(patches or {})
        )

    # ---- what the recording says ------------------------------------------------------------------------
    @property
    def command(self) -> str:
        """The device command that re-records the full bits (the recording's own entry)."""
        return str(self.meta.get("recording", {}).get("command", "the device command of the recording"))

    @property
    def source(self) -> str:
        """The recording's file, relative to the working directory where it lies below it."""
        if self.path is None:
            return "recording"
        try:
            return str(self.path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(self.path)

    def __contains__(self, key: str) -> bool:
        return key in self.digests

    def keys(self, prefix: str = "") -> list[str]:
        """The recorded arrays' keys (those starting with ``prefix``), in the recording's order."""
        return [k for k in self.digests if k.startswith(prefix)]

    def digest(self, key: str) -> Digest:
        try:
            return self.digests[key]
        except KeyError:
            raise KeyError(f"{self.source}: no recorded array {key!r}") from None

    # ---- checks -----------------------------------------------------------------------------------------
    def matches(self, key: str, bits: np.ndarray) -> bool:
        """Whether ``bits`` are the recorded array ``key`` (by its digest)."""
        return self.digest(key).matches(bits)

    def mismatch(self, key: str, bits: np.ndarray, what: str = "emulated") -> str:
        """Why ``bits`` are not the recorded ``key``, and how to see which elements differ."""
        return _message(self.source, key, self.digest(key), bits, self.command, what)

    def verify(self, key: str, bits: np.ndarray, what: str = "emulated") -> None:
        """Raise `RecordingMismatch` unless ``bits`` are the recorded array ``key``."""
        if not self.matches(key, bits):
            raise RecordingMismatch(self.mismatch(key, bits, what))

    def verify_all(self, arrays: dict[str, np.ndarray], what: str = "regenerated") -> None:
        """`verify()` every array of ``arrays`` (e.g. inputs regenerated from a seed)."""
        for k, a in arrays.items():
            self.verify(k, a, what)

    def bits(self, key: str, emulated: np.ndarray | None = None) -> np.ndarray:
        """The device's bits of ``key``, in the recorded shape: the kept array, or ``emulated`` (the emulator's
        output, with the recording's patch of ``key`` applied) once its digest matches; otherwise
        `RecordingMismatch`."""
        want = self.digest(key)
        if key in self.kept:
            return self.kept[key]
        if emulated is None:
            raise RecordingMismatch(f"{self.source}: {key} is kept as a digest only: pass the emulator's output")
        got = np.asarray(emulated)
        if key in self.patches:
            got = self.patches[key].apply(got)
        if not want.matches(got):
            raise RecordingMismatch(_message(self.source, key, want, got, self.command))
        return got.reshape(want.shape)


def dumps(obj: object, width: int = 160, indent: str = "") -> str:
    """JSON with one space of indentation per level, each value whose JSON fits ``width`` on one line."""
    flat = json.dumps(obj)
    if len(flat) <= width or not isinstance(obj, (dict, list)) or not obj:
        return flat
    inner = indent + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, width, inner).lstrip()}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [inner + dumps(v, width, inner).lstrip() for v in obj]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


# ---- kernel runs -----------------------------------------------------------------------------------------
def placeholders(digests: dict[str, Digest], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Read-only zero arrays of the outputs' dtypes in ``shapes``: what a run's shell holds where its outputs are
    digests (never compared: `RecordedRun` compares digests)."""
    return {n: np.broadcast_to(np.zeros((), np.dtype(digests[n].dtype)), shapes[n]) for n in shapes}


def run_shapes(h: int, n_q: int, n_k: int, d: int, names: list[str] | tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """The shapes `KernelRun` gives its outputs."""
    shapes = {"o": (h, n_q, d), "lse": (h, n_q), "dq": (h, n_q, d), "dk": (h, n_k, d), "dv": (h, n_k, d)}
    shapes["delta"] = (h, n_q)
    return {n: shapes[n] for n in names}


@dataclass(frozen=True)
class RunCheck:
    """One recorded run against the emulator: per output whether the bits are the recorded ones, and where the
    device's bits are known (kept, patched or proven by the digest) how many elements agree."""

    note: str
    same: dict[str, bool]
    checks: dict[str, OutputCheck]
    source: str = ""
    command: str = ""
    attention: AttentionCheck | None = None  # the device's O and LSE against FP64 attention, where they are known

    @property
    def identical(self) -> bool:
        return all(self.same.values())

    def agreement(self, name: str) -> tuple[int, int]:
        """(elements bit-identical, elements) of output ``name``."""
        c = self.checks[name]
        return c.identical, c.n

    def __str__(self) -> str:
        lines = [f"run: {self.note}"] if self.note else []
        for name, same in self.same.items():
            if name in self.checks:
                lines.append(str(self.checks[name]))
            else:
                lines.append(
                    f"{name:>5}: {'bit-identical to' if same else 'differs from'} the recorded bits (SHA-256)"
                    + ("" if same else f"; to see where, re-record the full bits with `{self.command}` ({RECORDS_DOC})")
                )
        lines += [str(self.attention)] if self.attention is not None else []
        return "\n".join(lines + ([f"recording: {self.source}"] if self.source and not self.identical else []))


class RecordedRun:
    """A kernel run kept compactly: its inputs (regenerated), settings and policy as a
    `KernelRun`, its outputs as the digests of a `Recording` (bits where
    kept).  `check()` reruns it; `outputs()` and `kernel_run()` give the device's bits, proven by the
    digests."""

    def __init__(self, shell: KernelRun, recording: Recording, keys: dict[str, str]) -> None:
        """``shell``: the run with placeholder outputs (or the kept ones); ``keys``: output name -> the
        recording's key of it."""
        self._shell = shell
        self.recording = recording
        self.keys = dict(keys)
        self._device: dict[str, np.ndarray] = {
            n: recording.kept[k].reshape(shell.outputs[n].shape) for n, k in self.keys.items() if k in recording.kept
        }

    @classmethod
    def build(
        cls,
        recording: Recording,
        keys: dict[str, str],
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        do: np.ndarray | None = None,
        debug: dict[str, np.ndarray] | None = None,
        **settings,
    ) -> RecordedRun:
        """A recorded run from its inputs ((H, N, d) each), its settings (as `KernelRun` takes them, but
        outputs) and ``keys`` (output name -> the recording's key)."""
        h, n_q, d = q.shape
        shapes = run_shapes(h, n_q, k.shape[1], d, list(keys))
        outputs = placeholders({n: recording.digest(key) for n, key in keys.items()}, shapes)
        shell = KernelRun(q=q, k=k, v=v, do=do, outputs=outputs, debug=dict(debug or {}), **settings)
        return cls(shell, recording, keys)

    # ---- the run's settings, as KernelRun has them ---------------------------------------------------------
    @property
    def q(self) -> np.ndarray:
        return self._shell.q

    @property
    def k(self) -> np.ndarray:
        return self._shell.k

    @property
    def v(self) -> np.ndarray:
        return self._shell.v

    @property
    def do(self) -> np.ndarray | None:
        return self._shell.do

    @property
    def dtype(self) -> str:
        return self._shell.dtype

    @property
    def causal(self) -> bool:
        return self._shell.causal

    @property
    def sm_scale(self) -> float:
        return self._shell.sm_scale

    @property
    def softmax(self) -> SoftmaxVariant:
        return self._shell.softmax

    @property
    def policy(self) -> Policy | PolicyRef:
        return self._shell.policy

    @property
    def note(self) -> str:
        return self._shell.note

    @property
    def debug(self) -> dict[str, np.ndarray]:
        return self._shell.debug

    @property
    def backward(self) -> bool:
        return self._shell.backward

    @property
    def names(self) -> list[str]:
        """The recorded outputs."""
        return list(self.keys)

    def resolve_policy(self, allow_import: AllowImport = False) -> Policy:
        """The run's policy, resolved (as `KernelRun.resolve_policy()`)."""
        return self._shell.resolve_policy(allow_import)

    def digest(self, name: str) -> Digest:
        return self.recording.digest(self.keys[name])

    def __repr__(self) -> str:
        return f"RecordedRun({self.note!r})"

    # ---- checks -----------------------------------------------------------------------------------------------
    def emulate(self, policy: Policy | PolicyRef | None = None) -> dict[str, np.ndarray]:
        """The emulator's outputs, as bits, under the run's policy or ``policy``."""
        run = self._shell if policy is None else dataclasses.replace(self._shell, policy=policy)
        return emulate(run)

    def matches(self, emulated: dict[str, np.ndarray]) -> dict[str, bool]:
        """Per recorded output, whether ``emulated`` holds the device's bits (by the digest)."""
        return {n: self.digest(n).matches(emulated[n]) for n in self.keys}

    def _known(self, name: str, own: dict[str, np.ndarray] | None) -> np.ndarray | None:
        """The device's bits of ``name`` if known: kept, proven before, or from ``own`` (the emulator's outputs
        under the run's policy) with the patch applied, once the digest matches."""
        if name in self._device:
            return self._device[name]
        if own is None:
            return None
        key = self.keys[name]
        got = own[name]
        if key in self.recording.patches:
            got = self.recording.patches[key].apply(got)
        if self.recording.matches(key, got):
            self._device[name] = got
            return got
        return None

    def outputs(self) -> dict[str, np.ndarray]:
        """The device's bits of every recorded output (shapes as `KernelRun` has them), proven by the
        digests: kept, or the emulator's outputs (patched); `RecordingMismatch` if the emulator no longer
        gives them."""
        own = None if all(n in self._device for n in self.keys) else self.emulate()
        out = {}
        for n, key in self.keys.items():
            bits = self._known(n, own)
            if bits is None:
                patch = self.recording.patches.get(key)
                raise RecordingMismatch(self.recording.mismatch(key, patch.apply(own[n]) if patch else own[n]))
            out[n] = bits
        return out

    def check(self, policy: Policy | PolicyRef | None = None, counts: bool = True) -> RunCheck:
        """Rerun under the run's policy (or ``policy``) and compare every recorded output with the device's bits:
        by digest, and with ``counts`` the number of identical elements and the ulp histogram where the device's
        bits are known (for another policy they are first proven under the run's own: `outputs()`).  Under the
        run's own policy, where the device's O (and LSE) are known, also whether they are attention's within the
        bound the policy's rounding allows (`RunCheck.attention`, `flashsim.bounds.check_attention()`)."""
        emu = self.emulate(policy)
        same = self.matches(emu)
        attention = self._attention(emu) if policy is None else None
        checks: dict[str, OutputCheck] = {}
        if counts:
            fmts = stored_formats(self.resolve_policy() if policy is None else _resolved(policy))
            device = {n: self._known(n, emu) for n in self.keys} if policy is None else self.outputs()
            for n in self.keys:
                if device[n] is not None:
                    checks[n] = check_bits(n, emu[n], device[n].reshape(emu[n].shape), fmts[n] or "fp32")
        elif policy is None:
            for n, ok in same.items():
                if ok:
                    self._device.setdefault(n, emu[n])
        return RunCheck(self.note, same, checks, self.recording.source, self.recording.command, attention)

    def _attention(self, emu: dict[str, np.ndarray]) -> AttentionCheck | None:
        """The attention check of the device's O and LSE, where both (or O, if no LSE was recorded) are known."""
        if "o" not in self.keys:
            return None
        o = self._known("o", emu)
        lse = self._known("lse", emu) if "lse" in self.keys else None
        if o is None or ("lse" in self.keys and lse is None):
            return None
        pol = self.resolve_policy()
        shapes = self._shell.outputs
        o = from_bits(o.reshape(shapes["o"].shape), stored_formats(pol)["o"])
        lse = None if lse is None else from_bits(lse.reshape(shapes["lse"].shape), None)
        return check_attention(self.q, self.k, self.v, o, lse, pol, self.softmax, self.sm_scale, self.causal)

    def kernel_run(self) -> KernelRun:
        """The run with the device's bits as its outputs (`outputs()`): for
        `crosscheck()`'s report, `save_run()`,
        `first_divergence()`."""
        out = self.outputs()
        return dataclasses.replace(self._shell, outputs={n: np.array(b) for n, b in out.items()})


def _resolved(policy: Policy | PolicyRef) -> Policy:
    return policy if isinstance(policy, Policy) else policy.resolve()


def run_entry(run: KernelRun, name: str, inputs: str) -> dict:
    """The JSON entry of a saved run in a recording of runs: its settings, policy reference, note and how its
    inputs are regenerated (``inputs``, a sentence)."""
    from .crosscheck import _policy_ref, _variant_dict

    return {
        "name": name,
        "dtype": run.dtype,
        "causal": bool(run.causal),
        "sm_scale": float(run.sm_scale),
        "softmax": _variant_dict(run.softmax),
        "policy": _policy_ref(run.policy).to_json(),
        "note": run.note,
        "inputs": inputs,
        "outputs": list(run.outputs),
    }


def run_from_entry(
    recording: Recording, entry: dict, inputs: dict[str, np.ndarray], debug: dict[str, np.ndarray] | None = None
) -> RecordedRun:
    """A run of a recording of runs (`run_entry()`) from its regenerated ``inputs`` (q, k, v and, for a
    backward run, do; (H, N, d) each), which are first checked against the recording's digests of them."""
    from .softmax import get_softmax

    name = entry["name"]
    recording.verify_all({f"{name}/{n}": a for n, a in inputs.items() if f"{name}/{n}" in recording})
    sm = dict(entry["softmax"])
    return RecordedRun.build(
        recording,
        {n: f"{name}/{n}" for n in entry["outputs"]},
        inputs["q"],
        inputs["k"],
        inputs["v"],
        inputs.get("do"),
        debug,
        dtype=entry["dtype"],
        causal=entry["causal"],
        sm_scale=entry["sm_scale"],
        softmax=get_softmax(sm.pop("name"), **sm),
        policy=PolicyRef.from_json(entry["policy"]),
        note=entry.get("note", ""),
    )


__all__ = [
    "FORMAT",
    "Digest",
    "Patch",
    "RecordedRun",
    "Recording",
    "RecordingMismatch",
    "RunCheck",
    "dumps",
    "placeholders",
    "run_entry",
    "run_from_entry",
    "run_shapes",
    "sha256_of",
]
