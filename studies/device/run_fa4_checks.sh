#!/usr/bin/env bash
# The FlashAttention-4 runs still open, for the second of FA4's two calls (studies/device/fa4_install.sh: the first
# call, carrying .fa4a, runs `bash studies/device/fa4_install.sh stash`; this one carries .fa4b):
#
#   OUT=/path/to/empty/folder bash studies/device/run_fa4_checks.sh
#
# - fa4/: FA4 on fresh launches, each launched twice with every output's bits kept, so that a default-path dQ whose
#   order the GPU chose is judged against every order of its adds instead of left unjudged (grid cases 320 on, which
#   no recording has used);
# - bench/: bench_gpu in bf16 and fp16 with FA4 among the baselines (its `cast_sum/fa4` column), FlexAttention left
#   out; about 250 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
source studies/device/fa4_install.sh install || exit 1
export PYTHONPATH=".:$PYTHONPATH" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
mkdir -p "$OUT/fa4" "$OUT/bench"
"$PY" -m studies.device.fresh_check --out "$OUT/fa4" --kernels fa4 --start 320 --cases 500 --repeat --keep-bits fa4 \
    --bits-cap 40 --workers 15 --budget 150 --deadline 220 2>&1 | tail -4
"$PY" -m benchmarks.bench_gpu --dtypes bf16,fp16 --n 4096,16384 --no-flex --rounds 5 --seconds 200 \
    --json "$OUT/bench/bench_fa4.json" 2>&1 | tail -30
