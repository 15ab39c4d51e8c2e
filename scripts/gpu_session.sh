#!/usr/bin/env bash
# One device call's worth of GPU checks, for binaries built on the build machine and carried as
# build/bin.tar.xz (make gpu-pack). Unpacks them, points the tests at this tree, runs the parts
# asked for (default: all of scripts/gpu_check.sh's), and leaves one archive of every log in $OUT.
#   bash scripts/gpu_session.sh [parts...]
set -u
cd "$(dirname "$0")/.."
if [ -f build/bin.tar.xz ]; then
  mkdir -p build && tar -C build -xJf build/bin.tar.xz || exit 2
fi
export UNET_SOURCE_DIR=$(pwd) UNET_BINARY=$(pwd)/build/bin/unet NCCL_NVLS_ENABLE=0
source scripts/gpu_libs.sh  # cuDNN (the system's, else PyTorch's) and NCCL (PyTorch's)
export UNET_CUDNN_CACHE=${UNET_CUDNN_CACHE:-$(pwd)/build/cudnn-plans.txt}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "${1:-}" = "--" ]; then shift; (cd build && "$@") 2>&1 | tee "$OUT/logs/custom.txt"; else
OUT="$OUT/logs" BUILD=build bash scripts/gpu_check.sh "$@"; fi
cp -r build/gpu-test-logs "$OUT/logs/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$OUT/logs"
