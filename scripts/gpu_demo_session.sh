#!/usr/bin/env bash
# One device call that retrains the model `make demo` ships and compares bf16 with tf32 training on
# the same real data (issues 15 and 9). Carry build/demo-carry: unet.tar.xz (bin/unet) and
# Fashion-MNIST's train-*-ubyte.gz. Results (<= 8 files) in $OUT.
#   OUT=... STEPS=16000 CMP_STEPS=3000 bash scripts/gpu_demo_session.sh
# CMP_ONLY=1 skips the retraining: the data and the init checkpoint are made again (deterministic)
# and only the CMP_PRECISION (tf32) run is trained, for comparing with a committed metrics.csv.
set -u
cd "$(dirname "$0")/.."
C=build/demo-carry
tar -C build -xJf "$C/unet.tar.xz" || exit 2
OUT=${OUT:-/tmp/demo-out}
W=/tmp/tdm
mkdir -p "$OUT"
export FASHION_MNIST_DIR=$C UNET_CUDNN_CACHE=/tmp/cudnn-plans.txt
source scripts/gpu_libs.sh
if [ -z "${CMP_ONLY:-}" ]; then
  PRECISION=${PRECISION:-bf16} STEPS=${STEPS:-16000} WORK=$W OUT="$OUT/fashion32.h5" \
    bash scripts/train_demo_model.sh build/bin/unet > "$OUT/run.log" 2>&1
  echo "demo: exit $?"; tail -n 12 "$OUT/run.log"
  cp "$W/grid.png" "$W/run/metrics.csv" "$W/run/metrics.png" "$OUT/" 2>/dev/null
else
  rm -rf "$W" && mkdir -p "$W"
  python3 scripts/fashion_mnist_to_png.py "$C" "$W/fashion" --split train --limit-per-class 6000 --size 32 > /dev/null
  build/bin/unet prepare "$W/fashion" -o "$W/data.h5" --image-size 32 --labels subdirs > /dev/null
  build/bin/unet init -o "$W/init.h5" --preset tiny32 --num-channels 64 --channel-mult 1,1 --class-cond \
    --num-classes 10 --seed 0 > /dev/null
  cp "${CMP_WITH:-testdata/demo/metrics.csv}" "$OUT/metrics.csv" 2>/dev/null
fi
# The same run in CMP_PRECISION (tf32) for CMP_STEPS steps: the loss curves side by side (issue 9).
CMP=${CMP_STEPS:-3000} CP=${CMP_PRECISION:-tf32}
build/bin/unet train "$W/data.h5" --init "$W/init.h5" -o "$W/run_$CP" --steps "$CMP" --batch-size 128 \
  --lr 3e-4 --lr-warmup 500 --ema-rate 0.9995 --grad-clip 1 --seed 0 --log-every 100 --save-every 0 \
  --precision "$CP" > "$W/$CP.log" 2>&1
echo "$CP run: exit $?"; tail -n 2 "$W/$CP.log"
cp "$W/run_$CP/metrics.csv" "$OUT/metrics_$CP.csv"
python3 - "$OUT/metrics.csv" "$OUT/metrics_$CP.csv" "$CP" <<'PY'
import csv, sys
a = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))}
b = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(sys.argv[2]))}
common = sorted(set(a) & set(b))
for s in common[:: max(1, len(common) // 10)] + common[-1:]:
    print(f"step {s}: bf16 {a[s]:.5f} {sys.argv[3]} {b[s]:.5f} ratio {a[s] / b[s]:.4f}")
late = [s for s in common if s > common[-1] // 2]
ma = sum(a[s] for s in late) / len(late); mb = sum(b[s] for s in late) / len(late)
print(f"mean loss over steps {late[0]}..{late[-1]}: bf16 {ma:.5f}, {sys.argv[3]} {mb:.5f} ({100 * (ma / mb - 1):+.2f}%)")
PY
