#!/usr/bin/env bash
# Issue 13 end to end on real labelled images: Fashion-MNIST 32x32, every file under demo/.
#   1. Debian's dataset-fashion-mnist idx files -> demo/fashion (train split, as make demo) and
#      demo/fashion_val (test split) -> demo/cls_data.h5, demo/cls_val.h5
#   2. unet train-classifier: the noisy classifier that guides (tiny32 preset: 32x32, 10 classes, the
#      shipped model's noise, linear T = 1000), --val-data demo/cls_val.h5 -> demo/cls/. Its accuracy on
#      noised validation images (the last windows of metrics.csv, also per quarter of [0, T)) against
#      chance, 10%.
#   3. unet train-classifier --noised=false, another seed: the judge, a classifier of clean images
#      -> demo/judge/
#   4. unet sample of the shipped class-conditional model testdata/demo/fashion32.h5 (make demo's), per
#      class, unguided and guided by demo/cls (--classifier-scale S) from the same noise
#      -> demo/guided/{unguided,guided}/class_KK.h5
#   5. the judge's top-1 agreement with the requested class, unguided vs guided
#      (scripts/classifier_eval.py), and demo/classifier_grid.png (training data | unguided | guided)
# GPU (nvidia-smi sees one): a few thousand steps; CPU: a short run that shows the pipeline. Knobs
# (defaults GPU / CPU):
#   CLS_STEPS (4000 / 300)          classifier steps       CLS_BATCH (128 / 32)        batch size
#   CLS_PER_CLASS (6000 / 500)      training images/class  CLS_VAL_PER_CLASS (500 / 100)
#   CLS_SCALE (3)                   --classifier-scale     CLS_COLS (20 / 4)           samples per class
#   CLS_SAMPLE_STEPS (50 / 10)      DDIM steps             CLS_DEVICE                  --device for unet
#   FASHION_MNIST_DIR (/usr/share/datasets/fashion-mnist)  CLS_MODEL (testdata/demo/fashion32.h5)
#   PYTHON (/usr/bin/python3, with numpy, h5py, matplotlib and torch for the judge)
set -euo pipefail
UNET=${1:-build/bin/unet}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
IDX=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
MODEL=${CLS_MODEL:-testdata/demo/fashion32.h5}
if nvidia-smi -L >/dev/null 2>&1; then
  KIND=GPU STEPS=${CLS_STEPS:-4000} BATCH=${CLS_BATCH:-128} PER_CLASS=${CLS_PER_CLASS:-6000}
  VAL=${CLS_VAL_PER_CLASS:-500} COLS=${CLS_COLS:-20} SSTEPS=${CLS_SAMPLE_STEPS:-50}
else
  KIND=CPU STEPS=${CLS_STEPS:-300} BATCH=${CLS_BATCH:-32} PER_CLASS=${CLS_PER_CLASS:-500}
  VAL=${CLS_VAL_PER_CLASS:-100} COLS=${CLS_COLS:-4} SSTEPS=${CLS_SAMPLE_STEPS:-10}
fi
SCALE=${CLS_SCALE:-3}
DEV=()
[ -n "${CLS_DEVICE:-}" ] && DEV=(--device "$CLS_DEVICE")
[ -x "$UNET" ] || { echo "classifier_demo: $UNET: not built (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "classifier_demo: $MODEL: no such model (CLS_MODEL)" >&2; exit 1; }
[ -f "$IDX/train-images-idx3-ubyte.gz" ] || [ -f "$IDX/train-images-idx3-ubyte" ] || {
  echo "classifier_demo: no Fashion-MNIST in $IDX (apt-get install dataset-fashion-mnist; or set FASHION_MNIST_DIR)" >&2
  exit 1
}

t0=$SECONDS
stage() { echo; echo "== [$((SECONDS - t0))s] $*"; }
mkdir -p demo
rm -rf demo/cls demo/judge demo/guided demo/classifier_grid.png demo/cls_val.h5 demo/cls_data.h5

stage "Fashion-MNIST ($IDX) -> demo/fashion ($PER_CLASS per class, train) and demo/fashion_val ($VAL per class, test)"
if [ "$(cat demo/fashion/.done 2>/dev/null)" = "$PER_CLASS" ]; then
  echo "demo/fashion already there (delete it to redo)"
else
  rm -rf demo/fashion
  "$PY" "$HERE/fashion_mnist_to_png.py" "$IDX" demo/fashion --split train --limit-per-class "$PER_CLASS" --size 32
  echo "$PER_CLASS" > demo/fashion/.done  # hidden: prepare skips it
fi
if [ "$(cat demo/fashion_val/.done 2>/dev/null)" = "$VAL" ]; then
  echo "demo/fashion_val already there"
else
  rm -rf demo/fashion_val
  "$PY" "$HERE/fashion_mnist_to_png.py" "$IDX" demo/fashion_val --split test --limit-per-class "$VAL" --size 32
  echo "$VAL" > demo/fashion_val/.done
fi
"$UNET" prepare demo/fashion -o demo/cls_data.h5 --image-size 32 --labels subdirs | tail -n 1
"$UNET" prepare demo/fashion_val -o demo/cls_val.h5 --image-size 32 --labels subdirs | tail -n 1

LOG=$((STEPS >= 1000 ? 100 : 10))
stage "train-classifier ($KIND budget): tiny32, $STEPS steps at batch $BATCH, noised, --val-data -> demo/cls"
"$UNET" train-classifier demo/cls_data.h5 --preset tiny32 --num-classes 10 -o demo/cls --steps "$STEPS" \
  --batch-size "$BATCH" --lr 3e-4 --weight-decay 0.05 --log-every "$LOG" --save-every "$STEPS" \
  --val-data demo/cls_val.h5 --seed 1 "${DEV[@]}" 2>&1 | tee demo/cls.log | grep -vE "^step" || true
tail -n 3 demo/cls.log | grep -E "^step" || true
[ -f demo/cls/latest.h5 ] || { echo "classifier_demo: train-classifier failed (demo/cls.log)" >&2; exit 1; }

stage "the judge: train-classifier --noised=false (clean images), seed 2 -> demo/judge"
"$UNET" train-classifier demo/cls_data.h5 --preset tiny32 --num-classes 10 -o demo/judge --steps "$STEPS" \
  --batch-size "$BATCH" --lr 3e-4 --weight-decay 0.05 --log-every "$LOG" --save-every "$STEPS" \
  --val-data demo/cls_val.h5 --noised=false --seed 2 "${DEV[@]}" > demo/judge.log 2>&1 ||
  { tail -n 3 demo/judge.log >&2; echo "classifier_demo: the judge's training failed" >&2; exit 1; }

# The last fifth of the run's validation rows: accuracy on noised (and, for the judge, clean)
# validation images, overall and per quarter of [0, T).
val_summary() {
  "$PY" - "$1" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/metrics.csv")))
tail = rows[-max(1, len(rows) // 5):]
def mean(k):
    v = [float(r[k]) for r in tail if r.get(k, "") != ""]
    return sum(v) / len(v) if v else float("nan")
q = " ".join(f"q{i} {100 * mean(f'val_acc1_q{i}'):.0f}%" for i in range(4) if mean(f"val_acc1_q{i}") == mean(f"val_acc1_q{i}"))
print(f"val top-1 {100 * mean('val_acc1'):.1f}% (chance 10%), top-5 {100 * mean('val_acc5'):.1f}%, loss "
      f"{mean('val_loss'):.3f}; by t quarter: {q}  [steps {tail[0]['step']}..{tail[-1]['step']}]")
PY
}
echo "noisy classifier (demo/cls):  $(val_summary demo/cls)"
echo "judge (demo/judge, clean):    $(val_summary demo/judge)"

# One `unet sample --h5` per class and setting, the same --seed: column j starts from the same x_T.
sample_rows() {
  local dir=$1; shift
  mkdir -p "$dir"
  local k
  for k in 0 1 2 3 4 5 6 7 8 9; do
    "$UNET" sample "$MODEL" -n "$COLS" --class "$k" --sampler ddim --steps "$SSTEPS" --seed 3 -o "" \
      --h5 "$dir/class_0$k.h5" "$@" "${DEV[@]}" > "$dir/sample.log" 2>&1 ||
      { cat "$dir/sample.log" >&2; echo "classifier_demo: sampling class $k failed" >&2; exit 1; }
  done
  grep -m1 "^unet sample:" "$dir/sample.log" || true
}
stage "sample $MODEL: $COLS per class, DDIM $SSTEPS, unguided -> demo/guided/unguided"
t_u=$SECONDS
sample_rows demo/guided/unguided
t_u=$((SECONDS - t_u))
stage "sample $MODEL: the same, guided by demo/cls at scale $SCALE -> demo/guided/guided"
t_g=$SECONDS
sample_rows demo/guided/guided --classifier demo/cls/latest.h5 --classifier-scale "$SCALE"
t_g=$((SECONDS - t_g))

stage "the judge's top-1 agreement with the requested class"
"$PY" "$HERE/classifier_eval.py" demo/judge/latest.h5 demo/guided/unguided demo/guided/guided | tee demo/guided/eval.txt
"$PY" "$HERE/demo_grid.py" -o demo/classifier_grid.png --data demo/cls_data.h5 \
  --panel "unguided ($(basename "$MODEL") --class K)" demo/guided/unguided \
  --panel "classifier guidance, scale $SCALE" demo/guided/guided \
  --title "Fashion-MNIST 32x32: the shipped model per class, DDIM $SSTEPS, without and with a noisy classifier ($STEPS steps)"
echo
echo "classifier demo done in $((SECONDS - t0))s on the $KIND; sampling ${t_u}s unguided, ${t_g}s guided"
echo "  demo/classifier_grid.png  training data | unguided | guided, one row per class"
echo "  demo/cls/, demo/judge/    metrics.csv (val_acc1 per t quarter), latest.h5"
echo "  demo/guided/eval.txt      the judge's agreement with the requested class"
