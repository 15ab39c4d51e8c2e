#!/usr/bin/env bash
# One device call that retrains the model `make demo` ships and compares bf16 with tf32 training on
# the same real data (issues 15 and 9). Carry build/demo-carry: unet.tar.xz (bin/unet) and
# Fashion-MNIST's train-*-ubyte.gz. Results (<= 8 files) in $OUT.
#   OUT=... STEPS=16000 CMP_STEPS=3000 bash scripts/gpu_demo_session.sh
set -u
cd "$(dirname "$0")/.."
C=build/demo-carry
tar -C build -xJf "$C/unet.tar.xz" || exit 2
OUT=${OUT:-/tmp/demo-out}
W=/tmp/tdm
mkdir -p "$OUT"
export FASHION_MNIST_DIR=$C UNET_CUDNN_CACHE=/tmp/cudnn-plans.txt
libs=$(python3 -c "import nvidia.cudnn, os; print(':'.join(os.path.join(p, 'lib') for p in nvidia.cudnn.__path__))" 2>/dev/null)
[ -n "$libs" ] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PRECISION=${PRECISION:-bf16} STEPS=${STEPS:-16000} WORK=$W OUT="$OUT/fashion32.h5" \
  bash scripts/train_demo_model.sh build/bin/unet > "$OUT/run.log" 2>&1
echo "demo: exit $?"; tail -n 12 "$OUT/run.log"
cp "$W/grid.png" "$W/run/metrics.csv" "$W/run/metrics.png" "$OUT/" 2>/dev/null
# The same run in tf32 for CMP_STEPS steps: the loss curves side by side (issue 9).
CMP=${CMP_STEPS:-3000}
build/bin/unet train "$W/data.h5" --init "$W/init.h5" -o "$W/run_tf32" --steps "$CMP" --batch-size 128 \
  --lr 3e-4 --lr-warmup 500 --ema-rate 0.9995 --grad-clip 1 --seed 0 --log-every 100 --save-every 0 \
  --precision tf32 > "$W/tf32.log" 2>&1
echo "tf32 run: exit $?"; tail -n 2 "$W/tf32.log"
cp "$W/run_tf32/metrics.csv" "$OUT/metrics_tf32.csv"
python3 - "$OUT/metrics.csv" "$OUT/metrics_tf32.csv" <<'PY'
import csv, sys
a = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))}
b = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(sys.argv[2]))}
common = sorted(set(a) & set(b))
for s in common[:: max(1, len(common) // 10)] + common[-1:]:
    print(f"step {s}: bf16 {a[s]:.5f} tf32 {b[s]:.5f} ratio {a[s] / b[s]:.4f}")
late = [s for s in common if s > common[-1] // 2]
ma = sum(a[s] for s in late) / len(late); mb = sum(b[s] for s in late) / len(late)
print(f"mean loss over steps {late[0]}..{late[-1]}: bf16 {ma:.5f}, tf32 {mb:.5f} ({100 * (ma / mb - 1):+.2f}%)")
PY
