#!/usr/bin/env bash
# The device runs still open in one call (about 540 s), each writing under its own folder of $OUT:
#
#   OUT=/path/to/empty/folder bash studies/device/run_open_checks.sh
#
# - subnormal/: every kernel that needs no upstream file, on bf16 inputs whose products are subnormal in FP32
#   (`flashsim.inputs` kind 'subnormal'), checked on the device as recorded; cuDNN's bits kept (its forward's flush
#   is inferred, not yet probed: sdpa_cudnn_policy; where its bits differ, `python -m studies.cudnn_flush_fit
#   subnormal/fresh_check.json --bits subnormal/fresh_bits_*.npz` names the steps that flush);
# - cudnn_dq/: cuDNN on fresh long launches, each launched twice with every output's bits kept, so that a dQ whose
#   order the GPU chose is judged against every order of its adds, not left unjudged;
# - e4m3/: the FP8 widening of `Config(e4m3_sum="packed")` (`--form swapped`): exact over [0, 1], and the FP8 cast_sum
#   forward's bits the same with it as without;
# - bench/: its cost, paired with the standard softmax and with cast_sum as it is (bench_gpu, FP8, 4096 keys).
#
# Seeds: fresh_check grid cases 700 on (subnormal) and 300 on (cudnn_dq), which no recording has used.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
mkdir -p "$OUT/subnormal" "$OUT/cudnn_dq" "$OUT/e4m3" "$OUT/bench"
"$PY" -m studies.device.fresh_check --out "$OUT/subnormal" --kernels sdpa_cudnn,sdpa_flash,sdpa_efficient,ours \
    --kinds subnormal --dtype bf16 --start 700 --cases 760 --repeat --keep-bits sdpa_cudnn --bits-cap 20 \
    --workers 12 --budget 140 --deadline 190 2>&1 | tail -8
"$PY" -m studies.device.fresh_check --out "$OUT/cudnn_dq" --kernels sdpa_cudnn --start 300 --cases 400 --repeat \
    --keep-bits sdpa_cudnn --bits-cap 30 --workers 12 --budget 120 --deadline 170 2>&1 | tail -4
"$PY" -m studies.device.e4m3_widened --out "$OUT/e4m3" --form swapped 2>&1 | tail -4
"$PY" -m benchmarks.bench_gpu --dtypes fp8 --n 4096 --no-flex --seconds 60 --json "$OUT/bench/bench_fp8.json" 2>&1 \
    | tail -8
