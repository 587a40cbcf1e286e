"""emufloat's hardware models against this machine's GPU, live (`-m gpu`; skipped without CUDA).

Small versions of the sections of studies/device/verify_models.py, which the recorded data in tests/data/h100 came from.
"""

import time

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def ctx(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from studies.device import verify_models as V

    return V.Ctx(tmp_path, 12345, time.monotonic() + 300, {"dots_per_type": 40_000, "reduction_rows": 4096})


def _clean(res: dict) -> None:
    for name, r in res.items():
        if isinstance(r, dict) and "mismatch" in r:
            assert r["compared"] > 0 and r["mismatch"] == 0, (name, r["first"][:4])


def test_function_models(ctx):
    from studies.device import verify_models as V

    _clean(V.section_cases(ctx))


def test_tensor_core_models(ctx):
    from studies.device import verify_models as V

    _clean(V.section_dot(ctx))


def test_reduction_trees(ctx):
    from studies.device import verify_models as V

    for r in V.section_reduction(ctx).values():
        _clean(r)
