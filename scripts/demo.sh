#!/usr/bin/env bash
# make demo: Fashion-MNIST end to end with the tiny32 preset, every file under demo/.
#   1. Debian's dataset-fashion-mnist idx files -> demo/fashion/<class>/<index>.png, a subset per class
#      (scripts/fashion_mnist_to_png.py; kept between runs)
#   2. unet prepare --labels subdirs -> demo/data.h5 (10 classes, 32x32)
#   3. unet init (tiny32 --num-channels 64 --channel-mult 1,1, class-conditional) + unet train from
#      scratch -> demo/run/
#   4. unet sample, one row per class, from the shipped model testdata/demo/fashion32.h5 (when it is
#      there) and from the model just trained -> demo/samples/{shipped,trained}/class_NN.h5
#   5. demo/grid.png (real images | shipped model | trained here) and demo/metrics.png (the run's curves)
# GPU (nvidia-smi sees one): trains long enough for recognisable garments; CPU: a few hundred steps,
# the whole demo in a few minutes on 2 cores. Environment knobs (defaults GPU / CPU):
#   DEMO_STEPS (6000 / 300)      training steps        DEMO_BATCH (128 / 16)     batch size
#   DEMO_PER_CLASS (6000 / 1000) images per class      DEMO_COLS (10 / 6)        samples per class
#   DEMO_SAMPLE_STEPS (100 / 20) DDIM steps            DEMO_DEVICE               --device for unet
#   FASHION_MNIST_DIR (/usr/share/datasets/fashion-mnist)   DEMO_PRETRAINED (testdata/demo/fashion32.h5)
#   PYTHON (/usr/bin/python3: the Debian python with numpy, h5py and matplotlib)
set -euo pipefail
UNET=${1:-build/bin/unet}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
IDX=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
SHIPPED=${DEMO_PRETRAINED:-testdata/demo/fashion32.h5}
if nvidia-smi -L >/dev/null 2>&1; then
  KIND=GPU STEPS=${DEMO_STEPS:-6000} BATCH=${DEMO_BATCH:-128} PER_CLASS=${DEMO_PER_CLASS:-6000}
  COLS=${DEMO_COLS:-10} SSTEPS=${DEMO_SAMPLE_STEPS:-100} LR=5e-4 EMA=0.999 WARMUP=200
else
  KIND=CPU STEPS=${DEMO_STEPS:-300} BATCH=${DEMO_BATCH:-16} PER_CLASS=${DEMO_PER_CLASS:-1000}
  COLS=${DEMO_COLS:-6} SSTEPS=${DEMO_SAMPLE_STEPS:-20} LR=1e-3 EMA=0.9 WARMUP=20
  # OpenMP threads spin between the step's many short parallel regions instead of sleeping
  # (libgomp reads this at start-up): tiny32 at batch 16 on 2 idle cores 114 -> 99 ms/step.
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-active}
fi
DEV=()
[ -n "${DEMO_DEVICE:-}" ] && DEV=(--device "$DEMO_DEVICE")
[ -x "$UNET" ] || { echo "demo: $UNET: not built (make build)" >&2; exit 1; }
[ -f "$IDX/train-images-idx3-ubyte.gz" ] || [ -f "$IDX/train-images-idx3-ubyte" ] || {
  echo "demo: no Fashion-MNIST in $IDX (apt-get install dataset-fashion-mnist, or make demo-deps; or set FASHION_MNIST_DIR)" >&2
  exit 1
}

t0=$SECONDS
stage() { echo; echo "== [$((SECONDS - t0))s] $*"; }
mkdir -p demo
rm -rf demo/run demo/data.h5 demo/init.h5 demo/samples demo/grid.png demo/metrics.png demo/train.log

stage "Fashion-MNIST ($IDX) -> demo/fashion/: $PER_CLASS training images per class, 32x32 PNGs"
if [ "$(cat demo/fashion/.done 2>/dev/null)" = "$PER_CLASS" ]; then
  echo "already there (delete demo/fashion to redo)"
else
  rm -rf demo/fashion
  "$PY" "$HERE/fashion_mnist_to_png.py" "$IDX" demo/fashion --split train --limit-per-class "$PER_CLASS" --size 32
  echo "$PER_CLASS" > demo/fashion/.done  # hidden: prepare skips it
fi

stage "prepare: demo/fashion -> demo/data.h5"
"$UNET" prepare demo/fashion -o demo/data.h5 --image-size 32 --labels subdirs

# The shipped model's shape (scripts/train_demo_model.sh says why 64 channels, not tiny32's 32).
read -r -a MFLAGS <<< "${DEMO_MODEL_FLAGS:---num-channels 64 --channel-mult 1,1}"
stage "init: tiny32 ${MFLAGS[*]}, class-conditional (10 classes) -> demo/init.h5"
"$UNET" init -o demo/init.h5 --preset tiny32 "${MFLAGS[@]}" --class-cond --num-classes 10 --seed 0

stage "train ($KIND budget): $STEPS steps at batch $BATCH from scratch -> demo/run"
t_train=$SECONDS
"$UNET" train demo/data.h5 --init demo/init.h5 -o demo/run --steps "$STEPS" --batch-size "$BATCH" --lr "$LR" \
  --lr-warmup "$WARMUP" --ema-rate "$EMA" --grad-clip 1 --log-every $((STEPS >= 1000 ? 100 : 10)) \
  --save-every "$STEPS" "${DEV[@]}" 2>&1 | tee demo/train.log
t_train=$((SECONDS - t_train))
device=$(sed -n 's/^unet: device \([a-z]*\).*/\1/p' demo/train.log | head -1)

# One `unet sample --h5` per class (--class K; the same seed, so column j starts from the same noise
# in every row): demo/samples/NAME/class_KK.h5.
sample_rows() {
  local ckpt=$1 dir=$2
  mkdir -p "$dir"
  local k out
  for k in 0 1 2 3 4 5 6 7 8 9; do
    if ! out=$("$UNET" sample "$ckpt" -n "$COLS" --class "$k" --sampler ddim --steps "$SSTEPS" --seed 1 -o "" \
      --h5 "$dir/class_0$k.h5" "${DEV[@]}" 2>&1); then
      echo "$out" >&2
      echo "demo: sampling class $k from $ckpt failed" >&2
      exit 1
    fi
    if [ "$k" = 0 ]; then echo "$out" | grep -v '^wrote'; printf 'classes:'; fi
    printf ' %s' "$k"
  done
  echo
}
panels=()
if [ -f "$SHIPPED" ]; then
  stage "sample: shipped model $SHIPPED, $COLS per class, DDIM $SSTEPS steps -> demo/samples/shipped"
  sample_rows "$SHIPPED" demo/samples/shipped
  panels+=(--panel "shipped model ($(basename "$SHIPPED"))" demo/samples/shipped)
  shipped_note="shipped model: $SHIPPED (the middle panel)"
else
  stage "sample: no shipped model yet ($SHIPPED; scripts/train_demo_model.sh trains it on a GPU) - skipped"
  shipped_note="no shipped model yet ($SHIPPED is made by scripts/train_demo_model.sh on a GPU)"
fi
stage "sample: the model trained here (demo/run/latest.h5), $COLS per class, DDIM $SSTEPS steps -> demo/samples/trained"
sample_rows demo/run/latest.h5 demo/samples/trained
panels+=(--panel "trained here: $STEPS steps, batch $BATCH, ${device:-?}, $((t_train / 60))m$((t_train % 60))s" demo/samples/trained)

stage "pictures: demo/grid.png, demo/metrics.png"
"$PY" "$HERE/demo_grid.py" -o demo/grid.png --data demo/data.h5 "${panels[@]}" \
  --title "Fashion-MNIST 32x32, unet tiny32 class-conditional: one row per class, DDIM $SSTEPS steps, EMA weights"
"$PY" "$HERE/plot_metrics.py" demo/run -o demo/metrics.png

loss=$(awk -F, 'NR == 2 { first = $2 } END { print first " -> " $2 " (step " $1 ")" }' demo/run/metrics.csv)
echo
echo "demo done in $((SECONDS - t0))s on the $KIND (${device:-?}); training loss $loss"
echo "  demo/grid.png     real images | $([ -f "$SHIPPED" ] && echo "shipped model | ")trained here, one row per class"
echo "  demo/metrics.png  loss, grad norm, lr, images/s of demo/run/metrics.csv"
echo "  demo/run/         metrics.csv, latest.h5 (unet sample demo/run/latest.h5 --class 7 -> sneakers)"
echo "  demo/data.h5      the prepared dataset ($((PER_CLASS * 10)) images; demo/fashion/ the PNGs)"
echo "  $shipped_note"
