"""gpu.launch.Launcher: compile once per specialisation, then launch the compiled kernel directly (CPU).

A stand-in kernel records how it is called, so the tests see which path each call takes; whether the
compiled kernels compute the same bits when launched this way is checked on the GPU by every GPU test
(they all go through gpu.flash), and their host time by benchmarks/host_time.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402

import gpu.launch as launch  # noqa: E402


class FakeKernel:
    """fn[grid](*args, **kw) records a compile-and-launch and returns a compiled stand-in, which records
    its launches."""

    arg_names = ["X", "Y", "n", "scale", "BLOCK", "FLAG"]
    __name__ = "fake"

    def __init__(self) -> None:
        self.compiles, self.launches = [], []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.compiles.append((grid, args, kw))
            kernel = self

            class Compiled:
                def __getitem__(self, grid):
                    return lambda *a: kernel.launches.append((grid, a))

            return Compiled()

        return run


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return FakeKernel()


def _args(x=None, y=None, n=64, scale=0.5):
    x = torch.zeros(64, dtype=torch.bfloat16) if x is None else x
    y = torch.zeros(64, dtype=torch.float32) if y is None else y
    return (x, y, n, scale)


def test_second_call_launches_the_compiled_kernel_with_constexprs_in_order(fake):
    run = launch.Launcher(fake)
    const, opts = {"BLOCK": 128, "FLAG": True}, {"num_warps": 4}
    run((2, 1), _args(), const, opts)
    assert len(fake.compiles) == 1 and fake.compiles[0][2] == {**const, **opts} and not fake.launches
    args = _args(n=96, scale=0.25)  # other values, the same specialisation (96 % 16 == 0, not 1)
    run((3, 1), args, const, opts)
    assert len(fake.compiles) == 1
    assert fake.launches == [((3, 1, 1), (*args, 128, True))]


@pytest.mark.parametrize(
    "change", ["dtype", "alignment", "n is 1", "n not divisible by 16", "n needs 64 bits", "constexpr", "option"]
)
def test_a_new_specialisation_compiles_again(fake, change):
    run = launch.Launcher(fake)
    const, opts = {"BLOCK": 128, "FLAG": True}, {"num_warps": 4}
    run((1, 1), _args(), const, opts)
    args = _args()
    if change == "dtype":
        args = _args(x=torch.zeros(64, dtype=torch.float16))
    elif change == "alignment":
        args = _args(x=torch.zeros(65, dtype=torch.bfloat16)[1:])
    elif change.startswith("n "):
        args = _args(n={"n is 1": 1, "n not divisible by 16": 17, "n needs 64 bits": 2**31}[change])
    elif change == "constexpr":
        const = {"BLOCK": 64, "FLAG": True}
    else:
        opts = {"num_warps": 8}
    run((1, 1), args, const, opts)
    assert len(fake.compiles) == 2 and not fake.launches


def test_the_key_separates_what_triton_specialises_on():
    """Where Triton's binder gives two arguments different specialisations, the key differs too."""
    values = [
        1,
        2,
        16,
        17,
        32,
        2**31 - 16,
        2**31,
        2**63,
        -16,
        -3,
        0.5,
        2.0,
        torch.zeros(8, dtype=torch.bfloat16),
        torch.zeros(9, dtype=torch.bfloat16)[1:],
        torch.zeros(8, dtype=torch.float16),
        torch.zeros(8, dtype=torch.float32),
        (0.5, 16),
        (0.5, 17),
        (0.5, 1),
        (2.0, torch.zeros(8, dtype=torch.bfloat16)),
        (0.5, torch.zeros(9, dtype=torch.bfloat16)[1:]),
        (1, 0.5),
        (16, 0.5),
    ]
    for a in values:
        for b in values:
            if native_specialize_impl(CUDABackend, a, False, True, True) != native_specialize_impl(
                CUDABackend, b, False, True, True
            ):
                assert launch._arg_key(a) != launch._arg_key(b), (a, b)


def test_wrong_constexpr_names_and_unknown_arguments_are_named(fake):
    run = launch.Launcher(fake)
    with pytest.raises(TypeError, match="takes \\['BLOCK', 'FLAG'\\]"):
        run((1, 1), _args(), {"FLAG": True, "BLOCK": 128}, {})
    with pytest.raises(TypeError, match="type list"):
        run((1, 1), (*_args()[:3], [1.0]), {"BLOCK": 128, "FLAG": True}, {})


def test_direct_false_takes_tritons_own_path_inside_the_block_only(fake):
    run = launch.Launcher(fake)
    const, opts = {"BLOCK": 128, "FLAG": True}, {"num_warps": 4}
    run((1, 1), _args(), const, opts)
    with launch.direct(False):
        run((1, 1), _args(), const, opts)  # compiled already, yet through fn[grid](...)
    assert len(fake.compiles) == 2 and not fake.launches
    run((1, 1), _args(), const, opts)
    assert len(fake.compiles) == 2 and len(fake.launches) == 1
    with pytest.raises(TypeError, match="direct: expected a bool"), launch.direct(0):
        pass


def test_records_are_keyed_field_by_field(fake):
    """A tuple argument (a record such as gpu.kernels.steps.SoftmaxConstants) specialises each field."""
    run = launch.Launcher(fake)
    const, opts = {"BLOCK": 128, "FLAG": True}, {"num_warps": 4}
    aligned, offset = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(9, dtype=torch.bfloat16)[1:]
    run((1, 1), (*_args()[:3], (0.5, aligned)), const, opts)
    run((1, 1), (*_args()[:3], (0.25, aligned)), const, opts)
    assert len(fake.compiles) == 1 and len(fake.launches) == 1
    run((1, 1), (*_args()[:3], (0.5, offset)), const, opts)
    assert len(fake.compiles) == 2
