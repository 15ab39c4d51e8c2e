#!/usr/bin/env bash
# One device call for the attention kernels (flash vs cublas), on binaries built here and carried
# as DIR/bin.tar.xz (bash scripts/gpu_pack.sh build unet test_attention; copy it, this script and
# gpu_libs.sh into a carried folder):
#   bash DIR/gpu_attention.sh [parts...]   parts: test bench memcheck racecheck profile model (default: all)
#   test      test_attention: every CUDA attention variant vs the CPU reference (UNET_TEST_VERBOSE)
#   bench     the speed table (UNET_ATTN_BENCH=1, AttentionBench.*)
#   memcheck, racecheck  compute-sanitizer on AttentionVariants.FlashSmallForSanitizer
#   profile   unet profile --layer attention, flash and cublas, seed64's 16x16 block, bf16
#   model     unet profile --layer model (seed64, batch 32), tf32 and bf16, flash vs cublas: CUDA events
# Logs go to $OUT (default /tmp/gpu-attention); a summary is printed last.
set -u
DIR=$(cd "$(dirname "$0")" && pwd)
cd "$DIR"
[ -f bin.tar.xz ] && tar -xJf bin.tar.xz
OUT=${OUT:-/tmp/gpu-attention}
mkdir -p "$OUT"
# cuDNN and NCCL as scripts/gpu_libs.sh picks them (copy it beside this script); without it, the
# libraries unet finds by itself
[ -f "$DIR/gpu_libs.sh" ] && source "$DIR/gpu_libs.sh"
export UNET_CUDNN_CACHE=/tmp/cudnn-plans.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
date -u
step() {  # step NAME SECONDS command...
  local name=$1 lim=$2 t0=$SECONDS
  shift 2
  timeout "$lim" "$@" >"$OUT/$name.txt" 2>&1
  echo "=== $name: rc $? in $((SECONDS - t0)) s"
}
parts=${*:-test bench memcheck racecheck profile model}
for p in $parts; do
  case $p in
    test)
      UNET_TEST_VERBOSE=1 step test 100 ./bin/test_attention
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|^\[  FAILED|Failure|Expected|Which is|differs" "$OUT/test.txt" | head -40
      # worst relative error per (variant, precision, pass)
      awk '/rel err/ { k = $(NF-6) " " $(NF-7) " " $(NF-5); e = $(NF-2) + 0;
             if (!(k in w) || e > w[k]) w[k] = e } END { for (k in w) printf "  worst %-22s %.2e\n", k, w[k] }' \
        "$OUT/test.txt" | sort
      ;;
    bench)
      UNET_ATTN_BENCH=1 step bench 80 ./bin/test_attention --gtest_filter='AttentionBench.*'
      grep -E '^\||FAILED|Failure' "$OUT/bench.txt"
      ;;
    memcheck)
      step memcheck 50 compute-sanitizer --tool memcheck --error-exitcode 9 ./bin/test_attention \
        --gtest_filter='AttentionVariants.FlashSmallForSanitizer'
      grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.txt" | head -5
      ;;
    racecheck)
      step racecheck 50 compute-sanitizer --tool racecheck --error-exitcode 9 ./bin/test_attention \
        --gtest_filter='AttentionVariants.FlashSmallForSanitizer'
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/racecheck.txt" | head -5
      ;;
    profile)
      for k in flash cublas; do
        step "profile_$k" 40 ./bin/unet profile --layer attention --batch-size 32 --resolution 16 \
          --in-channels 192 --precision bf16 --kernels attention=$k
        grep -iE "attention|flash|softmax|total" "$OUT/profile_$k.txt" | head -12
      done
      ;;
    model)
      for pr in tf32 bf16; do
        for k in flash cublas; do
          step "model_${pr}_$k" 30 ./bin/unet profile --layer model --batch-size 32 --precision $pr \
            --kernels attention=$k
          echo "  seed64 step, $pr, attention=$k: $(grep -o 'CUDA events [0-9.]* ms/iter' "$OUT/model_${pr}_$k.txt")"
        done
      done
      ;;
  esac
done
