#!/usr/bin/env bash
# All GPU work of the attention kernels (issue 5, 6): see gpu/run_attention.py.
#
#   OUT=/path/to/empty/folder bash gpu/run_attention.sh --sections smoke,configs,log2 [--seconds 540]
#
exec bash "$(dirname "$0")/run_module.sh" gpu.run_attention "$@"
