#!/usr/bin/env python3
"""Sampling and training at OpenAI's released sizes, unet vs guided-diffusion in PyTorch (issue 16).

Per preset (imagenet64, imagenet256, ...; random weights, classes drawn at random):
  sampling   images/s for 250 respaced DDPM steps at one batch size:
             unet: `unet sample --sampler ddpm`'s own time per step of its sampling loop (a run of
             S2 steps after a warm-up of S1) and `unet profile --pass forward` (kernel sum of the
             forward; device memory held, planned as for training);
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
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import profiled, run, timed  # noqa: E402

STEPS = 250  # guided-diffusion's released samplers: --timestep_respacing 250


def unet_profile(unet, preset, precision, batch, pass_):
    out = run([unet, "profile", "--preset", preset, "--layer", "model", "--batch-size", str(batch),
               "--precision", precision, "--pass", pass_, "--no-plain-timing"])
    m = re.search(r"CUDA-graph replays: kernel sum ([0-9.]+) ms/iter.*CUDA events ([0-9.]+) ms/iter", out)
    mem = re.search(r"Device memory held: ([0-9.]+) GB", out)
    if not m:
        print(out[-2000:])
        raise SystemExit("unet profile: no CUDA-graph line")
    return float(m.group(1)), float(m.group(2)), float(mem.group(1)) if mem else float("nan")


def unet_sample_ms(unet, ckpt, precision, batch, steps):
    """ms per DDPM step of the batch, as `unet sample` reports it for its sampling loop (no loading,
    planning or writing), from a run of S2 steps after a warm-up run of S1 (its cuDNN engine
    choices are timed and cached: the timed run reuses them)."""
    ms = None
    for s in steps:
        out = run([unet, "sample", ckpt, "-n", str(batch), "--batch-size", str(batch), "--sampler", "ddpm",
                   "--steps", str(s), "--precision", precision, "-o", ckpt + f".{s}.png"])
        m = re.search(r"([0-9.]+) ms per step of a batch", out)
        if not m:
            print(out[-2000:])
            raise SystemExit("unet sample: no timing line")
        ms = float(m.group(1))
    return ms


def torch_model(preset):
    import torch
    from unet_torch import PRESETS, create_model
    torch.manual_seed(0)
    f = PRESETS[preset]
    model = create_model(preset=preset).cuda().to(memory_format=torch.channels_last)
    return model, f


def bench_torch_sample(preset, mode, batch, iters=10, warmup=3):
    """ms per p_sample step (CUDA events) and kernel sum ms, guided-diffusion's sampler."""
    import torch
    from diffusion_torch import Diffusion, space_timesteps
    model, f = torch_model(preset)
    model.eval()
    tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    d = Diffusion(f["diffusion_steps"], f["noise_schedule"], learn_sigma=f["learn_sigma"],
                  use_timesteps=space_timesteps(f["diffusion_steps"], [STEPS]))
    R = f["image_size"]
    x = torch.randn(batch, 3, R, R, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, f["num_classes"], (batch,), device="cuda") if f["class_cond"] else None
    bf16 = mode.endswith("bf16")
    net = torch.compile(model) if mode.startswith("compile") else model

    def call(xx, tt, **kw):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return net(xx, tt, **kw).float()

    t = torch.full((batch,), STEPS // 2, device="cuda", dtype=torch.long)

    def step():
        with torch.no_grad():
            return d.p_sample(call, x, t, torch.randn_like(x), clip=True, labels=y)

    for _ in range(warmup + (5 if mode.startswith("compile") else 0)):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    wall = timed(step, iters)
    mem = torch.cuda.max_memory_allocated() / 1e9
    ks = profiled(step, 3)
    del model, net
    torch.cuda.empty_cache()
    return wall, ks, mem


def bench_torch_train(preset, mode, batch, iters=10, warmup=3):
    import torch
    import torch.nn.functional as F
    model, f = torch_model(preset)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    R = f["image_size"]
    x = (torch.rand(batch, 3, R, R, device="cuda") * 2 - 1).to(memory_format=torch.channels_last)
    noise = torch.randn_like(x)
    t = torch.randint(0, 1000, (batch,), device="cuda")
    y = torch.randint(0, f["num_classes"], (batch,), device="cuda") if f["class_cond"] else None
    ab = torch.linspace(0.9999, 0.01, 1000, device="cuda")[t].view(-1, 1, 1, 1)
    xt = ab.sqrt() * x + (1 - ab).sqrt() * noise
    bf16 = mode.endswith("bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = model(xt, t.float(), y=y)
        # eps part only (the learned-sigma channels get no MSE): the same work as the hybrid loss's
        # network passes, which dominate the step
        loss = F.mse_loss(out[:, :3].float(), noise)
        loss.backward()
        opt.step()
        return loss

    fn = torch.compile(step) if mode.startswith("compile") else step
    for _ in range(warmup + (5 if mode.startswith("compile") else 0)):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    wall = timed(fn, iters)
    mem = torch.cuda.max_memory_allocated() / 1e9
    ks = profiled(fn, 3)
    del model, opt
    torch.cuda.empty_cache()
    return wall, ks, mem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unet", default="build/bin/unet")
    ap.add_argument("--preset", default="imagenet64")
    ap.add_argument("--batch", type=int, default=64, help="sampling batch (unet and PyTorch)")
    ap.add_argument("--sample-steps", default="2,20", help="unet sample: warm-up steps, timed steps")
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
        ms = unet_sample_ms(a.unet, ckpt, p, a.batch, s12)
        ks, _, mem = unet_profile(a.unet, a.preset, p, a.batch, "forward")
        rows.append((f"unet {p}", ms, ks, mem))
        print(rows[-1], flush=True)
    for m in modes:
        try:
            w, ks, mem = bench_torch_sample(a.preset, m, a.batch)
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
            ks, ev, mem = unet_profile(a.unet, a.preset, p, a.train_batch, "step")
            lines.append(f"| unet {p} | {ev:.2f} | {ks:.2f} | {mem:.2f} |")
            print(lines[-1], flush=True)
        for m in modes:
            try:
                w, ks, mem = bench_torch_train(a.preset, m, a.train_batch)
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
