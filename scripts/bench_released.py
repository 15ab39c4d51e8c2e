#!/usr/bin/env python3
"""Sampling and training at OpenAI's released sizes, unet vs guided-diffusion in PyTorch (issue 16).

Per preset (imagenet64, imagenet256, ...; random weights, classes drawn at random):
  sampling   images/s for 250 respaced DDPM steps at one batch size:
             unet: `unet sample --sampler ddpm`'s own time per step of its sampling loop (a run of
             S2 steps after a warm-up of S1) and `unet profile --pass forward` (kernel sum of
             sampling's forward; device memory held by the sampling plan);
             PyTorch: guided-diffusion's p_sample (scripts/diffusion_torch.py) on its module tree
             (scripts/unet_torch.py, channels-last), eager and torch.compile, tf32 and bf16
             autocast: CUDA-event ms per step and summed GPU kernel time (torch.profiler).
             images/s = batch / (250 x ms per step).
  training   (--train-batch > 0) one step (forward + MSE + backward + AdamW) at that batch:
             `unet profile --layer model` (CUDA-graph replays) vs PyTorch eager / compile.

Run on the GPU machine:
    python3 scripts/bench_released.py --unet build/bin/unet --preset imagenet64 --batch 64 \
        --train-batch 32 --out DIR
    python3 scripts/bench_released.py --unet build/bin/unet --preset imagenet256 --batch 16
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import bench_torch_sample, bench_torch_train, run, unet_profile, unet_sample_wall  # noqa: E402

STEPS = 250  # guided-diffusion's released samplers: --timestep_respacing 250


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unet", default="build/bin/unet")
    ap.add_argument("--preset", default="imagenet64")
    ap.add_argument("--batch", type=int, default=64, help="sampling batch (unet and PyTorch)")
    ap.add_argument("--sample-steps", default="2,100", help="unet sample: warm-up steps, timed steps")
    ap.add_argument("--train-batch", type=int, default=0, help="also time a training step at this batch")
    ap.add_argument("--precisions", default="tf32,bf16")
    ap.add_argument("--torch-modes", default="eager tf32,eager bf16,compile tf32,compile bf16")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch
    gpu = torch.cuda.get_device_name()
    precs = [p for p in a.precisions.split(",") if p]
    modes = [m.strip() for m in a.torch_modes.split(",") if m.strip()]
    s12 = tuple(int(s) for s in a.sample_steps.split(","))
    work = tempfile.mkdtemp(prefix="bench-released-")
    ckpt = os.path.join(work, "ck.h5")
    run([a.unet, "init", "--preset", a.preset, "-o", ckpt, "--seed", "0"])
    lines = [f"{a.preset} on {gpu}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}", "",
             f"Sampling, batch {a.batch}, {STEPS} DDPM steps (images/s = batch / ({STEPS} x ms/step)):", "",
             "| implementation | wall ms/step | GPU kernel sum ms | memory GB | images/s | vs torch compile bf16 |",
             "|---|---:|---:|---:|---:|---:|"]
    rows = []
    for p in precs:
        ms = unet_sample_wall(a.unet, ckpt, p, a.batch, s12)
        ks, _, mem = unet_profile(a.unet, p, a.batch, "forward", preset=a.preset)
        rows.append((f"unet {p}", ms, ks, mem))
        print(rows[-1], flush=True)
    for m in modes:
        try:
            w, ks, mem = bench_torch_sample(m, a.batch, preset=a.preset, respacing=STEPS, iters=10, prof_iters=3)
            rows.append((f"torch {m}", w, ks, mem))
        except Exception as e:  # e.g. out of memory at this batch: say so, go on
            print(f"torch {m}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            rows.append((f"torch {m}", float("nan"), float("nan"), float("nan")))
        print(rows[-1], flush=True)
    base = dict((r[0], r[1]) for r in rows).get("torch compile bf16", float("nan"))
    for name, ms, ks, mem in rows:
        ips = a.batch * 1000 / (STEPS * ms)
        lines.append(f"| {name} | {ms:.2f} | {ks:.2f} | {mem:.2f} | {ips:.2f} | {base / ms:.2f}x |")
    if a.train_batch:
        lines += ["", f"Training step, batch {a.train_batch} (fwd + loss + bwd + AdamW):", "",
                  "| implementation | ms/step (unet: CUDA events; torch: wall) | GPU kernel sum ms | memory GB |",
                  "|---|---:|---:|---:|"]
        for p in precs:
            ks, ev, mem = unet_profile(a.unet, p, a.train_batch, "step", preset=a.preset)
            lines.append(f"| unet {p} | {ev:.2f} | {ks:.2f} | {mem:.2f} |")
            print(lines[-1], flush=True)
        for m in modes:
            try:
                w, ks, mem = bench_torch_train(m, a.train_batch, preset=a.preset, iters=10, prof_iters=3)
                lines.append(f"| torch {m} | {w:.2f} | {ks:.2f} | {mem:.2f} |")
            except Exception as e:
                print(f"torch train {m}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                lines.append(f"| torch {m} | failed: {type(e).__name__} | | |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"bench_{a.preset}.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
