#!/usr/bin/env bash
# Train the small byte-level GPT once per attention backend, one after another (studies/training/train.py), writing
# OUT/NAME.json (the log) and OUT/NAME.npz (sample and weights) per backend: 8 files for the four defaults.
#
#   OUT=/path/to/folder bash studies/device/run_training.sh [--attns paper,ours,ours_fix,sdpa] [train.py args...]
#
# Every backend gets the same arguments (steps, learning rate, --seconds, ...), so the same initial weights
# and batches. A backend that fails is reported and the next one still runs; the exit status is then 1.
# Each run goes through run_module.sh (this tree on PYTHONPATH, no install). Needs torch, Triton, numpy, numba,
# ml_dtypes, and Qiu & Yao's attention.py in .upstream/ for the paper's backends.
set -uo pipefail
here="$(dirname "$0")"
: "${OUT:?set OUT to the output folder}"
attns="paper,ours,ours_fix,sdpa"
if [ "${1:-}" = "--attns" ]; then
  attns="${2:?--attns needs a comma list}"
  shift 2
fi
status=0
for attn in ${attns//,/ }; do
  start=$(date +%s)
  if ! bash "$here/run_module.sh" studies.training.train --attn "$attn" "$@"; then
    echo "run_training: $attn failed" >&2
    status=1
  fi
  echo "run_training: $attn took $(( $(date +%s) - start )) s wall"
done
exit $status
