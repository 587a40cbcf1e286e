#!/usr/bin/env bash
# The live cross-check on a GPU: the GPU-marked tests (kernels against FP64 and autograd, Hypothesis
# properties: kernel == emulator on drawn inputs, P < 1 under the robust fix) and gpu.crosscheck --live over
# the case grid, whose runs are packed into $OUT/runs.tgz for `python -m flashsim crosscheck`.
#
#   OUT=/path/to/empty/folder bash studies/device/run_checks.sh [MAX_LEN] [PYTEST_K]
#
# With cold compile caches the GPU tests alone can outlast one device call; PYTEST_K runs the tests that
# pytest's -k selects and skips the cross-check, so that three calls cover them: `... run_checks.sh 200
# "fp64"`, `... run_checks.sh 200 "not fp64 and not two_p_equal_one"` and `... run_checks.sh 200
# "two_p_equal_one"` (docs/crosscheck.md, "On a GPU").
#
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT/runs"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_kernels.py tests/gpu/test_kernel_properties.py \
    ${2:+-k "$2"} --hypothesis-show-statistics 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -30
status=${PIPESTATUS[0]}
[ -n "${2:-}" ] && exit "$status"
"$PY" -m gpu.crosscheck --live --max-len "${1:-200}" --save "$OUT/runs" --quiet 2>&1 | tee "$OUT/crosscheck_live.txt" | tail -20
tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
