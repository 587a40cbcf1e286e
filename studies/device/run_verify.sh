#!/usr/bin/env bash
# Verify emufloat's hardware models against the GPU (see studies/device/verify_models.py and
# docs/hardware-models.md).
#
#   OUT=/path/to/empty/folder bash studies/device/run_verify.sh [--sections rcp,cases,...] [--seconds 540]
#
exec bash "$(dirname "$0")/run_module.sh" studies.device.verify_models "$@"
