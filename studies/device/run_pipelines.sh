#!/usr/bin/env bash
# The paper's reference pipeline, the torch ops it runs, cuDNN's crafted-input probe and the memory-efficient
# backend's deterministic path, on one GPU machine in one call (from the repository root):
#   OUT=/path PAPER=.upstream/qiu_yao_attention.py bash studies/device/run_pipelines.sh
# - studies.probes.torch_ops (torch.sum's trees, exp, log, bf16 division) and studies.probes.cudnn_steps,
# - record_kernels --kernels paper (112 cases, every einsum of three cells kept: gemms.npz),
# - record_kernels --kernels sdpa_efficient --deterministic (round 3), and one plain case (round 4) for the
#   launch-to-launch dQ experiment.
# Everything is packed into $OUT/pipelines.tar, split into parts of 15 MB (pipelines.tar.part_aa, ...): join
# them with cat.
set -u
: "${OUT:?set OUT to an output folder}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
W=$(mktemp -d)
mkdir -p "$W/probes" "$W/paper" "$W/det" "$W/order"
(python -m studies.probes.torch_ops --out "$W/probes" && python -m studies.probes.cudnn_steps --out "$W/probes") \
    > "$W/probes.log" 2>&1 &
timeout 400 python -m studies.device.record_kernels --out "$W/paper" --kernels paper --no-check \
    --paper "${PAPER:-.upstream/qiu_yao_attention.py}" --capture 640/64/False,640/128/True,200/128/False \
    > "$W/paper.log" 2>&1
timeout 300 python -m studies.device.record_kernels --out "$W/det" --kernels sdpa_efficient --round 3 --no-check \
    --deterministic > "$W/det.log" 2>&1
timeout 200 python -m studies.device.record_kernels --out "$W/order" --kernels sdpa_efficient --round 4 --no-check \
    --limit 1 > "$W/order.log" 2>&1
wait
tail -n 30 "$W"/*.log
tar cf "$OUT/pipelines.tar" -C "$W" . && (cd "$OUT" && split -b 15M pipelines.tar pipelines.tar.part_ && rm pipelines.tar)
ls -la "$OUT"
