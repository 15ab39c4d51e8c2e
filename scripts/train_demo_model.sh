#!/usr/bin/env bash
# Trains the model `make demo` ships: testdata/demo/fashion32.h5, tiny32 class-conditional on
# Fashion-MNIST 32x32 (issue 15). Run it on a GPU machine after `make build` and `make demo-deps`
# (Debian's dataset-fashion-mnist):
#
#   bash scripts/train_demo_model.sh [build/bin/unet]
#
# 1. the full training split (60000 images) -> WORK/fashion/<class>/*.png -> WORK/data.h5 (unet prepare)
# 2. unet init --preset tiny32 MODEL_FLAGS --class-cond --num-classes 10 --seed 0 -> WORK/init.h5
#    (MODEL_FLAGS default --num-channels 64 --channel-mult 1,1: with tiny32's 32 channels every
#    GroupNorm group of the output layer holds one channel, so the network cannot see or produce
#    an image's mean colour per channel (GroupNorm removes it) and DDIM amplifies the initial
#    noise's mean into a strong colour cast; two channels per group leave it a way through)
# 3. unet train STEPS steps -> WORK/run/ (metrics.csv, checkpoints, train.log)
# 4. the last checkpoint's EMA weights as its model weights (no optimizer state, no second copy:
#    the model flags and step counters stay; `unet sample` and `unet train --init` load it,
#    `--resume` says it cannot) -> OUT
# 5. checks: one `unet sample --class K` per class from OUT -> WORK/grid.png; WORK/run/metrics.png
# and prints the command line, the steps, the time and the final loss for the README.
#
# Environment (defaults): MODEL_FLAGS (above), PRECISION (unet's default: tf32 on a GPU),
# STEPS (20000), BATCH (128), LR (3e-4), WARMUP (500), EMA (0.9995),
# PER_CLASS (6000 = all of the split), SEED (0), DEVICE (unet's default: the GPU), COLS (10) and
# SAMPLE_STEPS (100): the check's samples per class and DDIM steps, OUT
# (testdata/demo/fashion32.h5), WORK (demo/train_demo_model), FASHION_MNIST_DIR
# (/usr/share/datasets/fashion-mnist), PYTHON (/usr/bin/python3, with numpy, h5py, matplotlib).
# Smoke test on a CPU (writes nothing in testdata/):
#   STEPS=20 BATCH=8 PER_CLASS=20 COLS=2 SAMPLE_STEPS=5 DEVICE=cpu OUT=/tmp/fashion32.h5 WORK=/tmp/tdm \
#     bash scripts/train_demo_model.sh
set -euo pipefail
UNET=${1:-build/bin/unet}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
IDX=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
MODEL_FLAGS=${MODEL_FLAGS:---num-channels 64 --channel-mult 1,1} PRECISION=${PRECISION:-}
STEPS=${STEPS:-20000} BATCH=${BATCH:-128} LR=${LR:-3e-4} WARMUP=${WARMUP:-500} EMA=${EMA:-0.9995}
PER_CLASS=${PER_CLASS:-6000} SEED=${SEED:-0} COLS=${COLS:-10} SSTEPS=${SAMPLE_STEPS:-100}
OUT=${OUT:-testdata/demo/fashion32.h5} WORK=${WORK:-demo/train_demo_model}
DEV=()
[ -n "${DEVICE:-}" ] && DEV=(--device "$DEVICE")
PREC=()
[ -n "$PRECISION" ] && PREC=(--precision "$PRECISION")
[ -x "$UNET" ] || { echo "train_demo_model: $UNET: not built (make build)" >&2; exit 1; }
[ -f "$IDX/train-images-idx3-ubyte.gz" ] || [ -f "$IDX/train-images-idx3-ubyte" ] || {
  echo "train_demo_model: no Fashion-MNIST in $IDX (apt-get install dataset-fashion-mnist, or make demo-deps)" >&2
  exit 1
}
t0=$SECONDS
stage() { echo; echo "== [$((SECONDS - t0))s] $*"; }

case "$WORK" in ""|/|.|..) echo "train_demo_model: WORK=$WORK: refusing to delete it" >&2; exit 1 ;; esac
rm -rf "$WORK"
mkdir -p "$WORK" "$(dirname "$OUT")"
stage "Fashion-MNIST train split ($PER_CLASS per class) -> $WORK/fashion -> $WORK/data.h5"
"$PY" "$HERE/fashion_mnist_to_png.py" "$IDX" "$WORK/fashion" --split train --limit-per-class "$PER_CLASS" --size 32
"$UNET" prepare "$WORK/fashion" -o "$WORK/data.h5" --image-size 32 --labels subdirs
rm -rf "$WORK/fashion"

stage "init: tiny32 $MODEL_FLAGS, class-conditional, 10 classes"
read -r -a MFLAGS <<< "$MODEL_FLAGS"
INIT=("$UNET" init -o "$WORK/init.h5" --preset tiny32 "${MFLAGS[@]}" --class-cond --num-classes 10 --seed "$SEED")
"${INIT[@]}"

TRAIN=("$UNET" train "$WORK/data.h5" --init "$WORK/init.h5" -o "$WORK/run" --steps "$STEPS" --batch-size "$BATCH"
       --lr "$LR" --lr-warmup "$WARMUP" --ema-rate "$EMA" --grad-clip 1 --seed "$SEED" "${PREC[@]}"
       --log-every $((STEPS >= 1000 ? 100 : 10)) --save-every $((STEPS >= 10000 ? 10000 : STEPS)) "${DEV[@]}")
stage "train: ${TRAIN[*]}"
t_train=$SECONDS
"${TRAIN[@]}" 2>&1 | tee "$WORK/train.log"
t_train=$((SECONDS - t_train))

stage "the EMA weights as the model, no optimizer state: $WORK/run/latest.h5 -> $OUT"
"$PY" - "$WORK/run/latest.h5" "$OUT" <<'PY'
import os, sys
import h5py
src, dst = sys.argv[1], sys.argv[2]
tmp = dst + ".tmp"
with h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
    for k, v in f.attrs.items():  # the model flags, format, version
        g.attrs[k] = v
    # ema/ becomes model/ (what `unet sample` would use anyway); not optimizer/ (m, v: only for --resume)
    f.copy(f["ema"] if "ema" in f else f["model"], g, name="model")
    if "state" in f:
        f.copy(f["state"], g, name="state")
os.replace(tmp, dst)
print(f"{dst}: {os.path.getsize(dst) / 1e6:.1f} MB (from {os.path.getsize(src) / 1e6:.1f} MB)")
PY

stage "check: sample every class from $OUT -> $WORK/grid.png; curves -> $WORK/run/metrics.png"
mkdir -p "$WORK/samples"
for k in 0 1 2 3 4 5 6 7 8 9; do
  "$UNET" sample "$OUT" -n "$COLS" --class "$k" --sampler ddim --steps "$SSTEPS" --seed 1 -o "" \
    --h5 "$WORK/samples/class_0$k.h5" "${DEV[@]}" > "$WORK/sample.log" 2>&1 ||
    { cat "$WORK/sample.log" >&2; echo "train_demo_model: unet sample failed on $OUT" >&2; exit 1; }
done
"$PY" "$HERE/demo_grid.py" -o "$WORK/grid.png" --data "$WORK/data.h5" --panel "$OUT, $STEPS steps" "$WORK/samples" \
  --title "tiny32 $MODEL_FLAGS class-conditional, DDIM $SSTEPS steps, EMA weights"
"$PY" "$HERE/plot_metrics.py" "$WORK/run"

device=$(sed -n 's/^unet: device \(.*\)$/\1/p' "$WORK/train.log" | head -1)
speed=$(sed -n 's/^step .*| \([0-9.]* ms\/step\)$/\1/p' "$WORK/train.log" | tail -1)
final=$(awk -F, 'NR > 1 { s[NR] = $2; last = $2; step = $1; n = NR }
  END { m = 0; c = 0; for (i = n; i > 1 && c < 10; i--) { m += s[i]; c++ }
        printf "%s at step %s (mean of the last %d logged: %.5f)", last, step, c, m / c }' "$WORK/run/metrics.csv")
cat <<EOF

== done in $((SECONDS - t0))s; for the README:
  data:     Fashion-MNIST train split, $((PER_CLASS * 10)) images, 32x32 (scripts/fashion_mnist_to_png.py + unet prepare)
  init:     ${INIT[*]}
  train:    ${TRAIN[*]}
  device:   ${device:-?}; $STEPS steps in ${t_train}s (last logged ${speed:-?})
  loss:     $final
  shipped:  $OUT ($(du -h "$OUT" | cut -f1), sha256 $(sha256sum "$OUT" | cut -c1-16)...)
  check:    $WORK/grid.png (real images | samples of $OUT by class, DDIM $SSTEPS), $WORK/run/metrics.png
EOF
