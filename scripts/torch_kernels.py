#!/usr/bin/env python3
"""Where PyTorch's GPU time goes, for comparing with `unet profile`'s kernel table: the top kernels
and the time per kernel class (convolution, GEMM, attention/softmax, fused Triton, other) of one
training step or one DDPM sampling step on guided-diffusion's model (bench.py's PyTorch benches).

    python3 scripts/torch_kernels.py --preset imagenet64 --pass sample --batch 64 --mode "compile bf16"
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

CLASSES = [("conv", ("conv", "cudnn", "xmma", "implicit", "dgrad", "wgrad", "fprop")),
           ("gemm", ("gemm", "nvjet", "cutlass", "cublas", "sm90_", "sm80_")),
           ("softmax", ("softmax",)),
           ("triton", ("triton",))]


def kclass(name):
    low = name.lower()
    for c, keys in CLASSES:
        if any(k in low for k in keys):
            return c
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="seed64")
    ap.add_argument("--pass", dest="pass_", choices=["sample", "train"], default="train")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--mode", default="compile bf16")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    kept = {}
    plain = bench.profiled

    def keep(fn, iters):
        import torch
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        kept["prof"], kept["iters"] = prof, iters
        return bench.kernel_sum_ms(prof, iters)

    bench.profiled = keep
    if a.pass_ == "train":
        wall, ks, mem = bench.bench_torch_train(a.mode, a.batch, preset=a.preset)
    else:
        wall, ks, mem = bench.bench_torch_sample(a.mode, a.batch, preset=a.preset)
    bench.profiled = plain
    prof, iters = kept["prof"], kept["iters"]
    per = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.profiler.kineto_results.events():
        if "CUDA" in str(e.device_type()):
            r = per[e.name()]
            r[0] += e.duration_ns() / 1e6 / iters
            r[1] += 1
    cls = collections.defaultdict(float)
    for n, (ms, _) in per.items():
        cls[kclass(n)] += ms
    print(f"torch {a.mode} {a.preset} {a.pass_} batch {a.batch}: wall {wall:.2f} ms, kernel sum {ks:.2f} ms, peak {mem:.2f} GB")
    print("by class: " + ", ".join(f"{c} {ms:.2f} ms ({100 * ms / ks:.0f}%)" for c, ms in sorted(cls.items(), key=lambda kv: -kv[1])))
    for n, (ms, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{ms:8.3f} ms {cnt // iters:5d}x  {kclass(n):7s} {n[:110]}")


if __name__ == "__main__":
    main()
