#!/usr/bin/env python3
"""One full training step (forward + loss + backward + AdamW) of seed64 at batch 32, 64x64:
unet (fp32, tf32) vs the PyTorch model of scripts/unet_torch.py (eager strict fp32, eager default
TF32 convs, torch.compile). Prints ms/step, peak GPU memory and ratios; run on the GPU machine:

    python3 scripts/bench.py --unet build/bin/unet [--out DIR]
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make_dataset(path, n=256, size=64, seed=0):
    import h5py
    rng = np.random.default_rng(seed)
    # Smooth random images (not white noise, not zeros): low-frequency blobs.
    base = rng.integers(0, 256, size=(n, size // 8, size // 8, 3)).astype(np.float32)
    img = np.repeat(np.repeat(base, 8, axis=1), 8, axis=2).astype(np.uint8)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=img, chunks=(64, size, size, 3))
        f.attrs["format"] = "unet-dataset"
        f.attrs["version"] = 1
        f.attrs["image_size"] = size
        f.attrs["count"] = n


def bench_unet(unet, data, precision, steps, batch, workdir):
    rundir = os.path.join(workdir, "run-" + precision)
    cmd = [unet, "train", data, "--preset", "seed64", "--batch-size", str(batch), "--steps", str(steps),
           "--log-every", str(steps // 3), "--save-every", "0", "--precision", precision, "-o", rundir]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"unet train failed ({precision})")
    rows = list(csv.DictReader(open(os.path.join(rundir, "metrics.csv"))))
    ms = float(rows[-1]["ms_per_step"])  # last window: warm (first window includes start-up)
    m = re.search(r"peak GPU memory ([0-9.]+) GB", p.stdout + p.stderr)
    mem = float(m.group(1)) if m else float("nan")
    return ms, mem, time.time() - t0


def bench_torch(mode, batch, iters=20, warmup=5):
    import torch
    import torch.nn.functional as F
    from unet_torch import create_model
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = mode != "eager-fp32"
    model = create_model(preset="seed64").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    x = torch.rand(batch, 3, 64, 64, device="cuda") * 2 - 1
    noise = torch.randn_like(x)
    t = torch.randint(0, 1000, (batch,), device="cuda")
    ab = torch.linspace(0.9999, 0.01, 1000, device="cuda")[t].view(-1, 1, 1, 1)
    xt = ab.sqrt() * x + (1 - ab).sqrt() * noise

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(xt, t), noise)
        loss.backward()
        opt.step()
        return loss

    fn = torch.compile(step) if mode == "compile" else step
    for _ in range(warmup + (10 if mode == "compile" else 0)):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    mem = torch.cuda.max_memory_allocated() / 1e9
    del model, opt
    torch.cuda.empty_cache()
    return statistics.median(times), mem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unet", default="build/bin/unet")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    a = ap.parse_args()
    import torch
    gpu = torch.cuda.get_device_name(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "bench.h5")
        make_dataset(data)
        for prec in ("fp32", "tf32", "bf16"):
            ms, mem, _ = bench_unet(a.unet, data, prec, a.steps, a.batch, tmp)
            rows.append((f"unet {prec}", ms, mem))
            print(f"unet {prec}: {ms:.2f} ms/step, peak {mem:.2f} GB", flush=True)
    if not a.skip_torch:
        for mode in ("eager-fp32", "eager-default") + (() if a.skip_compile else ("compile",)):
            ms, mem = bench_torch(mode, a.batch)
            rows.append((f"torch {mode}", ms, mem))
            print(f"torch {mode}: {ms:.2f} ms/step, peak {mem:.2f} GB", flush=True)
    ref = {n: ms for n, ms, _ in rows}
    lines = [f"seed64, batch {a.batch}, 64x64, one training step (fwd+loss+bwd+AdamW) on {gpu}, "
             f"{time.strftime('%Y-%m-%d')}",
             "",
             "| implementation | ms/step | peak GPU memory (GB) | vs torch eager default |",
             "|---|---:|---:|---:|"]
    base = ref.get("torch eager-default")
    for n, ms, mem in rows:
        ratio = f"{base / ms:.2f}x" if base else "-"
        lines.append(f"| {n} | {ms:.1f} | {mem:.2f} | {ratio} |")
    table = "\n".join(lines)
    print()
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        open(os.path.join(a.out, "bench.md"), "w").write(table + "\n")


if __name__ == "__main__":
    main()
