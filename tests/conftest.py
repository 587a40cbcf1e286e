"""Shared test configuration: hypothesis profile and the GPU marker."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# Importable without `pip install -e .` (e.g. `pytest tests/test_ops_oracle.py` from a checkout).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, print_blob=True
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
