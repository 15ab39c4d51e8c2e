"""Golden files for the engine's parity tests (tests/test_model_golden.cpp): the PyTorch model of
scripts/unet_torch.py (guided-diffusion's UNetModel) evaluated in float64 on small configurations
that together cover every model flag.

    /usr/bin/python3 scripts/make_golden.py [--out testdata/golden] [--seed 0]

File format, testdata/golden/<name>.h5 (all tensors in PyTorch layout, NCHW):
  root attributes   like a checkpoint (SPEC §2): format="unet-checkpoint", version=1 and every
                    model flag under its guided-diffusion name (dropout 0), so
                    unet::read_config / unet::load_checkpoint accept the file. Extra attributes:
                    golden_seed, and torch_fp32_out_err / torch_fp32_grad_err = the relative L2
                    errors that PyTorch itself makes in float32 on this file (what fp32 can reach).
  model/<name>      float32 (bfloat16-representable values), every parameter randomised, including guided-diffusion's zero-init
                    modules and the GroupNorm affine: weights ~ N(0, 1/fan_in) (x0.5 for the
                    zero-init modules), biases ~ 0.1 N(0,1), GroupNorm weight 1 + 0.2 N(0,1) and
                    bias 0.2 N(0,1), label_emb ~ N(0,1). Activations stay O(1).
  x                 float32 [B, C, H, W] ~ N(0,1) (bfloat16-representable)
  t                 float32 [B], integer values in [0, 1000)
  labels            int64 [B] in [0, num_classes)          (class-conditional models only)
  dout              float32 [B, Cout, H, W] ~ N(0,1) (bfloat16-representable)
  out               float32 [B, Cout, H, W] = model(x, t, labels)
  grad/<name>       float32, d(sum(out * dout)) / d(param)

`out` and `grad` are computed in float64 from the float32 values stored in the file (so they are
the exact-arithmetic answer for those inputs) and then rounded to float32. The one float32 step
kept from guided-diffusion is the timestep-embedding argument t*freq (freqs and the product in
float32, as its timestep_embedding does); cos/sin and everything after are float64.
"""

import argparse
import math
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from unet_ckpt import _write_flags  # noqa: E402
from unet_torch import create_model, normalize_flags  # noqa: E402

# Three small configurations; together they cover every flag (both attention orders, heads from
# num_head_channels and from num_heads, scale-shift on/off, resblock_updown on/off, learn_sigma,
# class_cond, attention at one or two resolutions, 2 and 3 levels, a channel change between levels,
# channel_mult[0] != 1, in_channels other than 3).
CONFIGS = {
    # (a) new attention order, heads from num_head_channels (3 heads of 32), plain ResBlocks and
    #     Up/Downsample, a channel change between levels (64 -> 96).
    "a_newattn_headch": dict(
        batch=2, image_size=16, in_channels=3, num_channels=32, channel_mult=(2, 3), num_res_blocks=1,
        attention_resolutions=(8,), num_heads=1, num_head_channels=32, use_new_attention_order=True,
        use_scale_shift_norm=False, resblock_updown=False, learn_sigma=False, class_cond=False),
    # (b) legacy attention order with num_heads=2, scale-shift norm, ResBlock up/down, learned
    #     sigma, 5 classes.
    "b_legacy_updown_cond": dict(
        batch=3, image_size=8, in_channels=3, num_channels=32, channel_mult=(2, 2), num_res_blocks=1,
        attention_resolutions=(4,), num_heads=2, num_head_channels=-1, use_new_attention_order=False,
        use_scale_shift_norm=True, resblock_updown=True, learn_sigma=True, class_cond=True,
        num_classes=5),
    # (c) 3 levels, scale-shift, plain resampling, attention at two resolutions, class-conditional,
    #     one input channel.
    "c_3level_2attn": dict(
        batch=2, image_size=8, in_channels=1, num_channels=32, channel_mult=(2, 2, 2), num_res_blocks=1,
        attention_resolutions=(4, 2), num_heads=1, num_head_channels=32, use_new_attention_order=True,
        use_scale_shift_norm=True, resblock_updown=False, learn_sigma=False, class_cond=True,
        num_classes=3),
}

# Every feature map has >= 64 channels (2 per GroupNorm group): with 32 channels each group is a
# single channel, GroupNorm then cancels any per-channel constant, and the gradients of the
# time-embedding path and of conv biases feeding a GroupNorm are exactly zero -- useless (and
# unmeasurable by relative error) as golden values.

ZERO_INIT = (".out_layers.3.", ".proj_out.")


def randomize(model, gen):
    """All parameters random. Values are rounded to bfloat16-representable float32 numbers: the
    stored values are exact, bf16 engines see exactly the same weights, and the file compresses
    (the low 16 bits are zero)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            n = torch.randn(shape, generator=gen, dtype=torch.float64)
            is_norm = isinstance(_module_of(model, name), torch.nn.GroupNorm)
            if name == "label_emb.weight":
                v = n
            elif is_norm:
                v = 1 + 0.2 * n if name.endswith(".weight") else 0.2 * n
            elif name.endswith(".bias"):
                v = 0.1 * n
            else:
                fan_in = int(np.prod(shape[1:]))
                v = n / math.sqrt(fan_in)
                if any(z in name for z in ZERO_INIT) or name.startswith("out.2."):
                    v = 0.5 * v
            p.copy_(v.to(torch.bfloat16).float())


def _module_of(model, param_name):
    return model.get_submodule(param_name.rsplit(".", 1)[0])


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def forward_backward(model, x, t, y, dout):
    model.zero_grad(set_to_none=True)
    out = model(x, t, y)
    (out * dout).sum().backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return out.detach(), grads


def make(name, spec, out_dir, seed):
    spec = dict(spec)
    batch = spec.pop("batch")
    flags = normalize_flags(spec, dropout=0.0)
    gen = torch.Generator().manual_seed(seed * 1000 + sum(map(ord, name)))
    model = create_model(flags)
    randomize(model, gen)
    model.eval()

    C, S = flags["in_channels"], flags["image_size"]
    cout = 2 * C if flags["learn_sigma"] else C
    x = torch.randn((batch, C, S, S), generator=gen).bfloat16().float()
    t = torch.randint(0, 1000, (batch,), generator=gen).float()
    y = torch.randint(0, flags["num_classes"], (batch,), generator=gen) if flags["class_cond"] else None
    dout = torch.randn((batch, cout, S, S), generator=gen).bfloat16().float()

    m64 = create_model(flags).double().eval()
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    out64, g64 = forward_backward(m64, x.double(), t, y, dout.double())
    out32, g32 = forward_backward(model, x, t, y, dout)
    out_err = rel_l2(out32, out64)
    grad_err = max(rel_l2(g32[k], g64[k]) for k in g64)

    path = os.path.join(out_dir, name + ".h5")
    tmp = path + ".tmp"
    gz = dict(compression="gzip", compression_opts=9, shuffle=True)
    with h5py.File(tmp, "w") as f:
        _write_flags(f, flags)
        f.attrs["golden_seed"] = np.int64(seed)
        f.attrs["torch_fp32_out_err"] = np.float64(out_err)
        f.attrs["torch_fp32_grad_err"] = np.float64(grad_err)
        g = f.create_group("model")
        for k, v in model.state_dict().items():
            g.create_dataset(k, data=v.numpy().astype(np.float32), **gz)
        f.create_dataset("x", data=x.numpy().astype(np.float32), **gz)
        f.create_dataset("t", data=t.numpy().astype(np.float32))
        if y is not None:
            f.create_dataset("labels", data=y.numpy().astype(np.int64))
        f.create_dataset("dout", data=dout.numpy().astype(np.float32), **gz)
        f.create_dataset("out", data=out64.numpy().astype(np.float32), **gz)
        g = f.create_group("grad")
        for k, v in g64.items():
            g.create_dataset(k, data=v.numpy().astype(np.float32), **gz)
    os.replace(tmp, path)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"{path}: {nparam} parameters, batch {batch}, out std {out64.std().item():.3f}, "
          f"torch fp32 vs float64: out {out_err:.2e}, worst grad {grad_err:.2e}, "
          f"{os.path.getsize(path) / 1e6:.2f} MB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "golden")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="comma-separated configuration names")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for name, spec in CONFIGS.items():
        if a.only and name not in a.only.split(","):
            continue
        make(name, spec, a.out, a.seed)


if __name__ == "__main__":
    main()
