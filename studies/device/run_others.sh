#!/usr/bin/env bash
# Other people's kernels, and the models they need, on one GPU machine in one call (from the repository root):
#   OUT=/path TUTORIAL=.upstream/triton_06_fused_attention.py bash studies/device/run_others.sh
# - libdevice log2f on all 2**32 inputs and tl.sum on tiles of 16 to 256 columns (verify_models),
# - the small Triton kernel of tests/gpu/test_model_your_kernel.py, live, its runs kept (tiny.tgz),
# - Triton's tutorial and SDPA's backends on fresh cases, held to the emulator (record_kernels).
# Writes $OUT/run.log, $OUT/verify/{verify.json,libdevice.npz}, $OUT/tiny.tgz, $OUT/others/{others.json,others.npz,
# others_bwd.npz}: 7 files.
set -u
: "${OUT:?set OUT to an output folder}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$OUT/verify" "$OUT/tiny" "$OUT/others"
timeout 520 python -m studies.device.verify_models --out "$OUT/verify" --sections libdevice,reduction --seconds 480 \
    --params '{"reduction_rows": 32768}' > "$OUT/verify.txt" 2>&1 &
(RECORD_DIR="$OUT/tiny" timeout 300 python -m pytest -q -p no:cacheprovider tests/gpu/test_model_your_kernel.py \
    -k live > "$OUT/tiny.txt" 2>&1; tar czf "$OUT/tiny.tgz" -C "$OUT" tiny && rm -r "$OUT/tiny") &
timeout 540 python -m studies.device.record_kernels --out "$OUT/others" \
    --tutorial "${TUTORIAL:-.upstream/triton_06_fused_attention.py}" "$@" > "$OUT/others.txt" 2>&1
wait
cat "$OUT/verify.txt" "$OUT/tiny.txt" "$OUT/others.txt" > "$OUT/run.log"
rm -f "$OUT/verify.txt" "$OUT/tiny.txt" "$OUT/others.txt" "$OUT/verify/verify.log"
tail -40 "$OUT/run.log"
