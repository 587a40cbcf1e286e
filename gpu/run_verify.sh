#!/usr/bin/env bash
# Verify emufloat's hardware models against the GPU (see gpu/verify_models.py and docs/hardware-models.md).
#
#   OUT=/path/to/empty/folder bash gpu/run_verify.sh [--sections rcp,cases,...] [--seconds 540]
#
# Needs torch, triton, numpy, numba, ml_dtypes (no network, no pip): runs from this tree with PYTHONPATH=.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
exec "$PY" -m gpu.verify_models --out "$OUT" "$@"
