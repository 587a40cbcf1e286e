#!/usr/bin/env bash
# Run the GPU calibration probes (exp2/exp, fp32 division, tl.dot, tl.sum) on one CUDA GPU.
#
#   OUT=/path/to/empty/folder bash studies/device/run_probes.sh [extra args for python -m studies.probes.run]
#
# Needs torch and triton (no network, no pip). The probes share a time budget (--budget), each in its own
# process with its own time limit. Writes results.json, run.log and *.npz to $OUT (7 files, well under
# 64 MiB); see docs/probes.md.
exec bash "$(dirname "$0")/run_module.sh" studies.probes.run "$@"
