#!/usr/bin/env bash
# Run one of the GPU entry modules from this tree: bash studies/device/run_module.sh MODULE [args...]
# (run_probes.sh, run_verify.sh and run_attention.sh beside it call it). Needs OUT set to the output folder;
# needs torch, triton, numpy, numba, ml_dtypes (no network, no pip): PYTHONPATH=. instead of an install.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
module="$1"
shift
exec "$PY" -m "$module" --out "$OUT" "$@"
