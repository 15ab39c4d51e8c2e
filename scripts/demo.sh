#!/usr/bin/env bash
# make demo: the whole pipeline on the bundled images (testdata/images) with the tiny32 preset.
# Uses the GPU when one is present, else the CPU (unet says which).
set -euo pipefail
UNET=${1:-build/bin/unet}
# A few minutes either way: 300 steps on 2 CPU cores, 2000 on a GPU.
if nvidia-smi -L >/dev/null 2>&1; then STEPS=${DEMO_STEPS:-2000}; else STEPS=${DEMO_STEPS:-300}; fi
mkdir -p demo
rm -rf demo/run demo/data.h5 demo/init.h5 demo/samples.png demo/samples.h5 demo/samples
echo "== prepare: testdata/images -> demo/data.h5"
"$UNET" prepare testdata/images -o demo/data.h5 --image-size 32 --labels subdirs
echo "== init: tiny32 -> demo/init.h5"
"$UNET" init -o demo/init.h5 --preset tiny32 --seed 0
echo "== train: $STEPS steps -> demo/run"
"$UNET" train demo/data.h5 --init demo/init.h5 -o demo/run --steps "$STEPS" --batch-size 16 --lr 3e-4 \
  --ema-rate 0.95 --log-every 25 --save-every 100
echo "== sample: DDIM 50 steps -> demo/samples.png"
"$UNET" sample demo/run/latest.h5 -n 16 --sampler ddim --steps 50 -o demo/samples.png --h5 demo/samples.h5 \
  --png-dir demo/samples
echo
echo "demo files:"
echo "  dataset      demo/data.h5"
echo "  init         demo/init.h5"
echo "  run          demo/run/ (metrics.csv, ckpt_*.h5, latest.h5)"
echo "  sample grid  demo/samples.png (and demo/samples.h5, demo/samples/*.png)"
