#!/usr/bin/env bash
# All GPU work of the attention kernels (issue 5, 6): see gpu/run_attention.py.
#
#   OUT=/path/to/empty/folder bash gpu/run_attention.sh --sections smoke,configs,log2 [--seconds 540]
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
exec "$PY" -m gpu.run_attention --out "$OUT" "$@"
