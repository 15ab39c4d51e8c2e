#!/usr/bin/env python3
"""unet vs PyTorch on one GPU, in one run (issue 10): seed64, 64x64.

Training step (forward + MSE + backward + AdamW, batch 32):
  unet fp32 / tf32 / bf16   `unet profile --layer model`: summed kernel time and CUDA-event time of
                            CUDA-graph replays, device memory held; and `unet train`'s own ms/step
                            (wall, metrics.csv's last window)
  torch eager fp32 / eager tf32 / compile tf32 / compile + bf16 autocast, on scripts/unet_torch.py
                            (guided-diffusion's module tree): CUDA-event time per step (wall: it
                            includes the host's launch gaps) and summed GPU kernel time
                            (torch.profiler), peak memory
Sampling (64 images, one DDPM step = one forward + the posterior update):
  unet tf32 / bf16          wall ms per step of `unet sample --sampler ddpm`'s sampling loop (its own
                            timing line, after a warm-up run) and `unet profile --pass forward`
  torch eager / compile     guided-diffusion's p_sample on the same model (scripts/diffusion_torch.py),
                            CUDA-event ms per step

PyTorch's wall time on this class of machine is dominated by host overhead; compare against its
kernel sum (what a PyTorch user with CUDA graphs would approach). unet's GPU time is its CUDA
events without the profiler attached (`unet profile`'s last line). Run on the GPU machine:

    python3 scripts/bench.py --unet build/bin/unet [--out DIR] [--skip-compile]

DIR/bench.md and DIR/bench.json are rewritten after every row, and a run stopped by SIGTERM or
Ctrl-C prints the rows it measured, so a time limit loses only the row in progress. The whole run
takes ~12 minutes (torch.compile's compilations most of it); where one call of the machine is
shorter, run it again with the same DIR and --resume: it keeps the rows DIR/bench.json holds
(measured on the same GPU model) and measures the rest, into one table.
"""
import argparse
import csv
import json
import os
import re
import signal
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


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return p.stdout + p.stderr


def unet_profile(unet, precision, batch, pass_="step", preset="seed64"):
    """(kernel sum ms, CUDA events ms, device memory GB) of CUDA-graph replays: the kernel sum
    from the profiled replays, the CUDA events from `unet profile`'s timing without the profiler
    attached (CUPTI's records add ~0.3 ms to a step) where it printed one."""
    out = run([unet, "profile", "--preset", preset, "--layer", "model", "--batch-size", str(batch), "--precision",
               precision, "--pass", pass_])
    return parse_profile(out)


# What the runs reported about themselves (the cuDNN unet loaded), for the table's heading.
FOUND = {}


def parse_profile(out):
    lib = re.search(r"^Convolution library: (.+)$", out, re.M)
    if lib:
        FOUND["cudnn"] = lib.group(1)
    m = re.search(r"CUDA-graph replays: kernel sum ([0-9.]+) ms/iter.*CUDA events ([0-9.]+) ms/iter", out)
    plain = re.search(r"without the profiler attached \(graph replays\): CUDA events ([0-9.]+) ms/iter", out)
    mem = re.search(r"Device memory held: ([0-9.]+) GB", out)
    if not m:
        print(out[-2000:])
        raise SystemExit("unet profile: no CUDA-graph line")
    return (float(m.group(1)), float((plain or m).group(1 if plain else 2)),
            float(mem.group(1)) if mem else float("nan"))


def unet_train_wall(unet, data, precision, steps, batch, workdir):
    rundir = os.path.join(workdir, "run-" + precision)
    run([unet, "train", data, "--preset", "seed64", "--batch-size", str(batch), "--steps", str(steps),
         "--log-every", str(steps // 3), "--save-every", "0", "--precision", precision, "-o", rundir])
    rows = list(csv.DictReader(open(os.path.join(rundir, "metrics.csv"))))
    return float(rows[-1]["ms_per_step"])  # last window: warm (the first includes start-up)


def load_rows(out, gpu):
    """(train, samp, heading) an earlier run saved in out/bench.json on this GPU model, for
    --resume; ([], [], None) when there is none. Another GPU's rows are refused (SystemExit)."""
    path = os.path.join(out, "bench.json")
    if not os.path.exists(path):
        return [], [], None
    try:
        with open(path) as f:
            j = json.load(f)
        train, samp = [tuple(r) for r in j["train"]], [tuple(r) for r in j["samp"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a bench.py result ({e})")
    if j.get("gpu") != gpu:
        raise SystemExit(f"{path}: measured on {j.get('gpu')}, this GPU is {gpu}; give another --out")
    FOUND.update(j.get("found") or {})
    return train, samp, j.get("base")


def save_rows(out, gpu, base, train, samp):
    """out/bench.json: the rows so far (what --resume reads), written whole or not at all."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "bench.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"gpu": gpu, "base": base, "found": FOUND, "train": train, "samp": samp}, f)
    os.replace(path + ".tmp", path)


def unet_sample_wall(unet, ckpt, precision, n, steps=(2, 60)):
    """ms per DDPM step for n images, as `unet sample` reports its sampling loop (no loading,
    planning or PNG writing; the steady state from the third step on), from a run of steps[1]
    steps after a warm-up run of steps[0]."""
    ms = None
    for s in steps:
        out = run([unet, "sample", ckpt, "-n", str(n), "--batch-size", str(n), "--sampler", "ddpm", "--steps", str(s),
                   "--precision", precision, "-o", ckpt + f".{s}.png"])
        # the steady state (from the third step on: the first two load kernels and capture the
        # CUDA graph), as PyTorch's per-step medians; else the whole loop's mean
        m = (re.search(r"([0-9.]+) ms per step from the third on", out)
             or re.search(r"([0-9.]+) ms per step of a batch", out))
        if not m:
            print(out[-2000:])
            raise SystemExit("unet sample: no timing line")
        ms = float(m.group(1))
    return ms


def kernel_sum_ms(prof, iters):
    """Summed GPU kernel (and memcpy/memset) time per iteration from a torch.profiler run."""
    total_us = 0.0
    for e in prof.events():
        dev = str(getattr(e, "device_type", ""))
        if "CUDA" in dev:
            total_us += getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) or 0.0
    if total_us == 0.0:  # older/newer attribute names: the kineto records themselves
        for e in prof.profiler.kineto_results.events():
            if "CUDA" in str(e.device_type()):
                total_us += e.duration_ns() / 1000.0
    return total_us / 1000.0 / iters


def timed(fn, iters):
    import torch
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def profiled(fn, iters):
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return kernel_sum_ms(prof, iters)


TORCH_TRAIN = ("eager fp32", "eager tf32", "compile tf32", "compile bf16")


def torch_model(preset):
    """guided-diffusion's module tree for a preset, channels-last on the GPU, and its flags."""
    import torch
    from unet_torch import create_model, normalize_flags
    torch.manual_seed(0)
    model = create_model(preset=preset).cuda().to(memory_format=torch.channels_last)
    return model, normalize_flags(None, preset=preset)


def random_labels(f, n):
    import torch
    return torch.randint(0, f["num_classes"], (n,), device="cuda") if f["class_cond"] else None


def bench_torch_train(mode, batch, preset="seed64", iters=20, warmup=5, prof_iters=10):
    """One training step (fwd + MSE + bwd + AdamW): CUDA-event ms, kernel sum ms, peak GB."""
    import torch
    import torch.nn.functional as F
    model, f = torch_model(preset)
    tf32 = mode != "eager fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    R = f["image_size"]
    x = (torch.rand(batch, 3, R, R, device="cuda") * 2 - 1).to(memory_format=torch.channels_last)
    noise = torch.randn_like(x)
    t = torch.randint(0, 1000, (batch,), device="cuda")
    y = random_labels(f, batch)
    ab = torch.linspace(0.9999, 0.01, 1000, device="cuda")[t].view(-1, 1, 1, 1)
    xt = ab.sqrt() * x + (1 - ab).sqrt() * noise
    bf16 = mode.endswith("bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = model(xt, t.float(), y=y)
        # eps channels only (learned sigma's get no MSE): the same network passes as the hybrid loss
        loss = F.mse_loss(out[:, :3].float(), noise)
        loss.backward()
        opt.step()
        return loss

    fn = torch.compile(step) if mode.startswith("compile") else step
    for _ in range(warmup + (10 if mode.startswith("compile") else 0)):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    wall = timed(fn, iters)
    mem = torch.cuda.max_memory_allocated() / 1e9
    ks = profiled(fn, prof_iters)
    del model, opt
    torch.cuda.empty_cache()
    return wall, ks, mem


def bench_torch_sample(mode, n, preset="seed64", respacing=None, iters=20, warmup=3, prof_iters=10):
    """One guided-diffusion p_sample step (DDPM; the preset's schedule, respaced to `respacing`
    steps if given) for n images: CUDA-event ms, kernel sum ms, peak GB."""
    import torch
    from diffusion_torch import Diffusion, space_timesteps
    model, f = torch_model(preset)
    model.eval()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    T = f["diffusion_steps"]
    d = Diffusion(T, f["noise_schedule"], learn_sigma=f["learn_sigma"],
                  use_timesteps=space_timesteps(T, [respacing]) if respacing else None)
    R = f["image_size"]
    x = torch.randn(n, 3, R, R, device="cuda").to(memory_format=torch.channels_last)
    y = random_labels(f, n)
    bf16 = mode.endswith("bf16")
    net = torch.compile(model) if mode.startswith("compile") else model

    def call(xx, tt, **kw):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return net(xx, tt, **kw).float()

    t = torch.full((n,), (respacing or T) // 2, device="cuda", dtype=torch.long)

    def step():
        with torch.no_grad():
            return d.p_sample(call, x, t, torch.randn_like(x), clip=True, labels=y)

    for _ in range(warmup + (5 if mode.startswith("compile") else 0)):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    wall = timed(step, iters)
    mem = torch.cuda.max_memory_allocated() / 1e9
    ks = profiled(step, prof_iters)
    del model, net
    torch.cuda.empty_cache()
    return wall, ks, mem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unet", default="build/bin/unet")
    ap.add_argument("--steps", type=int, default=60, help="unet train steps for the wall time")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sample-n", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--skip-fp32", action="store_true", help="leave out unet fp32 and torch eager fp32 (slow)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows --out's bench.json holds (an earlier, stopped run on this GPU) and "
                         "measure only the others")
    a = ap.parse_args()
    if a.resume and not a.out:
        ap.error("--resume needs --out (the folder of the earlier run's bench.json)")
    import torch
    gpu = torch.cuda.get_device_name(0)
    train, samp, base = load_rows(a.out, gpu) if a.resume else ([], [], None)
    if train or samp:
        print(f"resuming: {len(train) + len(samp)} rows from {os.path.join(a.out, 'bench.json')}: "
              + ", ".join(n for n, *_ in train) + " | " + ", ".join(n for n, *_ in samp), flush=True)
    base = base or (f"seed64, 64x64, on {gpu}, torch {torch.__version__} (its cuDNN "
                    f"{torch.backends.cudnn.version()}), {time.strftime('%Y-%m-%d')}")

    def have(rows, name):  # measured by an earlier run (--resume)
        return any(r[0] == name for r in rows)

    def head():
        return base + (f"; unet's convolution library: {FOUND['cudnn']}" if "cudnn" in FOUND else "")

    def save():  # after every row: a run stopped by a time limit keeps what it measured
        if a.out:
            save_rows(a.out, gpu, base, train, samp)
            open(os.path.join(a.out, "bench.md"), "w").write(render(head(), a.batch, a.sample_n, train, samp) + "\n")

    def stopped(signum, frame):
        print(f"\nstopped (signal {signum}); the rows measured so far:\n", flush=True)
        print(render(head(), a.batch, a.sample_n, train, samp), flush=True)
        sys.exit(1)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "bench.h5")
        make_dataset(data)
        for prec in (() if a.skip_fp32 else ("fp32",)) + ("tf32", "bf16"):
            if have(train, f"unet {prec}"):
                continue
            ks, ev, mem = unet_profile(a.unet, prec, a.batch)
            wall = unet_train_wall(a.unet, data, prec, a.steps, a.batch, tmp)
            train.append((f"unet {prec}", wall, ks, ev, mem))
            save()
            print(f"unet {prec}: train wall {wall:.2f} ms/step, kernel sum {ks:.2f}, events {ev:.2f}, "
                  f"memory {mem:.2f} GB", flush=True)
        ckpt = os.path.join(tmp, "run-tf32", "latest.h5")
        if not os.path.exists(ckpt) and not (have(samp, "unet tf32") and have(samp, "unet bf16")):
            # the tf32 training row came from an earlier run: fresh weights
            ckpt = os.path.join(tmp, "init.h5")  # (the sampling loop's time does not depend on them)
            run([a.unet, "init", "--preset", "seed64", "-o", ckpt])
        for prec in ("tf32", "bf16"):
            if have(samp, f"unet {prec}"):
                continue
            wall = unet_sample_wall(a.unet, ckpt, prec, a.sample_n)
            ks, ev, _ = unet_profile(a.unet, prec, a.sample_n, "forward")
            samp.append((f"unet {prec}", wall, ev))  # its GPU time: lanes overlap kernels (see train)
            save()
            print(f"unet sample {prec}: {wall:.2f} ms/step wall, forward kernel sum {ks:.2f} ms, CUDA events "
                  f"{ev:.2f} ms", flush=True)
    if not a.skip_torch:
        modes = [m for m in TORCH_TRAIN if not (a.skip_compile and m.startswith("compile"))
                 and not (a.skip_fp32 and m.endswith("fp32"))]
        for mode in modes:
            if have(train, f"torch {mode}"):
                continue
            wall, ks, mem = bench_torch_train(mode, a.batch)
            train.append((f"torch {mode}", wall, ks, float("nan"), mem))
            save()
            print(f"torch {mode}: {wall:.2f} ms/step (events), kernel sum {ks:.2f}, peak {mem:.2f} GB", flush=True)
        for mode in ("eager tf32", "eager bf16") + (() if a.skip_compile else ("compile tf32", "compile bf16")):
            if have(samp, f"torch {mode}"):
                continue
            wall, ks, _ = bench_torch_sample(mode, a.sample_n)
            samp.append((f"torch {mode}", wall, ks))
            save()
            print(f"torch sample {mode}: {wall:.2f} ms/step, kernel sum {ks:.2f}", flush=True)

    table = render(head(), a.batch, a.sample_n, train, samp)
    print()
    print(table)
    save()


def render(head, batch, sample_n, train, samp):
    """The markdown tables of the rows measured (train: (name, wall, kernel sum, events, memory);
    samp: (name, wall, GPU ms))."""

    def ratio(base, v):
        return f"{base / v:.2f}x" if base and v == v and v > 0 else "-"

    base = {n: ks for n, _, ks, _, _ in train}.get("torch compile tf32")
    lines = [head, "",
             f"Training step (batch {batch}; fwd + MSE + bwd + AdamW):", "",
             "| implementation | wall ms/step | GPU kernel sum ms | unet: CUDA events ms | memory GB | "
             "GPU time vs torch.compile tf32 |",
             "|---|---:|---:|---:|---:|---:|"]
    # GPU time of a step: unet's CUDA events around a graph replay (its kernels run on two streams,
    # so their sum exceeds the step's span); PyTorch's kernel sum (a lower bound of its GPU time:
    # its events are dominated by host overhead)
    for n, wall, ks, ev, mem in train:
        lines.append(f"| {n} | {wall:.2f} | {ks:.2f} | {'-' if ev != ev else f'{ev:.2f}'} | {mem:.2f} | "
                     f"{ratio(base, ks if ev != ev else ev)} |")
    sbase = {n: w for n, w, _ in samp}.get("torch compile tf32")
    lines += ["", f"Sampling, one DDPM step for {sample_n} images:", "",
              "| implementation | wall ms/step | GPU ms (unet: the forward's CUDA events; PyTorch: kernel sum) | "
              "wall vs torch.compile tf32 |",
              "|---|---:|---:|---:|"]
    for n, wall, ks in samp:
        lines.append(f"| {n} | {wall:.2f} | {ks:.2f} | {ratio(sbase, wall)} |")
    lines += ["", "unet memory: device memory held (planned buffers, weights, optimizer, workspaces); "
              "torch: peak allocated. unet train wall: metrics.csv's last window (includes data loading). "
              "GPU time: unet's CUDA events without the profiler attached (its kernels overlap on two "
              "streams, so their sum is larger), PyTorch's kernel sum."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
