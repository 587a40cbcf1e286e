#!/usr/bin/env bash
# All GPU work of the attention kernels: see studies/device/run_attention.py.
#
#   OUT=/path/to/empty/folder bash studies/device/run_attention.sh --sections smoke,configs,log2 [--seconds 540]
#
exec bash "$(dirname "$0")/run_module.sh" studies.device.run_attention "$@"
