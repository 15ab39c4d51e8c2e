"""PyTorch reference of guided-diffusion's noisy-image classifier and of classifier guidance.

The classifier is guided-diffusion's EncoderUNetModel with pool="attention", as its
create_classifier builds it: the UNet's time embedding, input blocks and middle block (the very
modules of unet_torch.py, so state_dict names are the same), then `out` = GroupNorm, SiLU,
AttentionPool2d (positional_embedding [C, H*W+1], qkv_proj, QKVAttention with one head per
num_head_channels, c_proj), returning the logits of the first (mean) token. Fixed as in
create_classifier: 3 input channels (a flag here), legacy attention order in the blocks, 64
channels per head (a flag here, for small models), no dropout, channel_mult by image size
(a flag here too).

    from classifier_torch import create_classifier
    clf = create_classifier(preset="tiny32")         # or keyword flags, e.g. classifier_width=64
    logits = clf(x, t)                               # x [B,C,H,W], t [B] (float) -> [B, num_classes]

Guidance (guided-diffusion's classifier_sample.py and GaussianDiffusion.condition_mean /
condition_score), on diffusion_torch.Diffusion:

    g = cond_fn(clf, x, t_model, y, scale)           # scale * d/dx sum_b log_softmax(clf(x, t))[b, y_b]
    x = guided_p_sample(d, model, clf, scale, x, t, z, y, ...)    # DDPM step, condition_mean
    x = guided_ddim_step(d, model, clf, scale, x, t, z, y, ...)   # DDIM step, condition_score

The classifier sees the timestep the model sees (respaced steps mapped to the original ones, times
1000/T with rescale_timesteps), as SpacedDiffusion wraps cond_fn. guided-diffusion casts the
conditioned mean to float32 (`.float()`); here everything stays in the model's dtype (float64 for
golden values: the exact answer the float32 engine is compared with).

Command line (golden values for the C++ tests, float64, fresh random weights):
    python3 classifier_torch.py golden OUT.h5 --seed S [--preset NAME] [--flag value ...] [--batch B]
      OUT: a classifier checkpoint (attributes, model/) plus x [B,C,H,W], t [B], dout [B,K],
      logits [B,K], grad/<name> = d sum(logits * dout) / d param, dx = d sum(logits * dout) / d x,
      and for labels guide_y [B] and the scale attribute guide_scale: guide = cond_fn(x, t, y, s).
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from unet_torch import (AttentionBlock, Downsample, QKVAttention, ResBlock, TimestepEmbedSequential,  # noqa: E402
                        normalization, timestep_embedding)

FORMAT = "unet-classifier"
VERSION = 1

# guided-diffusion's classifier_defaults() (+ the fixed values of create_classifier as flags, and
# the diffusion flags the classifier is trained under).
CLASSIFIER_DEFAULTS = dict(
    image_size=64,
    in_channels=3,
    classifier_width=128,
    classifier_depth=2,
    classifier_channel_mult=(),  # () = create_classifier's choice for the image size
    classifier_attention_resolutions=(32, 16, 8),
    classifier_use_scale_shift_norm=True,
    classifier_resblock_updown=True,
    classifier_pool="attention",
    classifier_num_head_channels=64,
    num_classes=1000,
    diffusion_steps=1000,
    noise_schedule="linear",
)

# Same presets as lib/model/config.cpp (classifier_preset).
CLASSIFIER_PRESETS = {
    "default": dict(),
    "tiny32": dict(image_size=32, classifier_width=32, classifier_depth=1, classifier_channel_mult=(1, 2, 2),
                   classifier_attention_resolutions=(16, 8), classifier_num_head_channels=32, num_classes=10),
    # OpenAI's released classifiers (guided-diffusion README): 64x64_classifier.pt has depth 4 and
    # guides the cosine-schedule 64x64 model (its README command line has --noise_schedule cosine).
    "imagenet64": dict(classifier_depth=4, noise_schedule="cosine"),
    "imagenet128": dict(image_size=128),
    "imagenet256": dict(image_size=256),
    "imagenet512": dict(image_size=512),
}

GD_MULT = {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}
_BOOL = ("classifier_use_scale_shift_norm", "classifier_resblock_updown")
_INT = ("image_size", "in_channels", "classifier_width", "classifier_depth", "classifier_num_head_channels",
        "num_classes", "diffusion_steps")


def _ints(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        return tuple(int(s) for s in v.split(",") if s.strip())
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (int, float)):
        return (int(v),)
    return tuple(int(s) for s in v)


def _mults(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        v = [float(s) for s in v.split(",") if s.strip()]
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (int, float)):
        v = [v]
    return tuple(int(x) if float(x).is_integer() else float(x) for x in v)


def normalize_classifier_flags(flags=None, preset=None, **kw):
    """A complete flag dict (defaults, preset, flags, keywords) with plain Python types; the
    channel multipliers resolved (by image size when not given). Unknown keys are dropped."""
    out = dict(CLASSIFIER_DEFAULTS)
    if preset is not None:
        out.update(CLASSIFIER_PRESETS[preset])
    for src in (flags or {}), kw:
        for k, v in src.items():
            if k in CLASSIFIER_DEFAULTS:
                out[k] = v
    for k in _BOOL:
        v = out[k]
        if isinstance(v, (str, bytes)):
            v = (v.decode() if isinstance(v, bytes) else v).lower() in ("1", "true", "yes", "t", "y")
        out[k] = bool(v)
    for k in _INT:
        out[k] = int(out[k])
    for k in ("classifier_pool", "noise_schedule"):
        v = out[k]
        out[k] = v.decode() if isinstance(v, bytes) else str(v)
    out["classifier_attention_resolutions"] = _ints(out["classifier_attention_resolutions"])
    mult = _mults(out["classifier_channel_mult"])
    if not mult:
        if out["image_size"] not in GD_MULT:
            raise ValueError(f"unsupported image size: {out['image_size']} (give classifier_channel_mult)")
        mult = GD_MULT[out["image_size"]]
    out["classifier_channel_mult"] = mult
    return out


class AttentionPool2d(nn.Module):
    """guided-diffusion's AttentionPool2d (adapted from CLIP)."""

    def __init__(self, spacial_dim, embed_dim, num_heads_channels, output_dim=None):
        super().__init__()
        self.positional_embedding = nn.Parameter(torch.randn(embed_dim, spacial_dim ** 2 + 1) / embed_dim ** 0.5)
        self.qkv_proj = nn.Conv1d(embed_dim, 3 * embed_dim, 1)
        self.c_proj = nn.Conv1d(embed_dim, output_dim or embed_dim, 1)
        self.num_heads = embed_dim // num_heads_channels
        self.attention = QKVAttention(self.num_heads)

    def forward(self, x):
        b, c, *_spatial = x.shape
        x = x.reshape(b, c, -1)  # NC(HW)
        x = torch.cat([x.mean(dim=-1, keepdim=True), x], dim=-1)  # NC(HW+1)
        x = x + self.positional_embedding[None, :, :].to(x.dtype)  # NC(HW+1)
        x = self.qkv_proj(x)
        x = self.attention(x)
        x = self.c_proj(x)
        return x[:, :, 0]


class EncoderUNetModel(nn.Module):
    """guided-diffusion's EncoderUNetModel (dims=2, conv_resample=True, pool="attention")."""

    def __init__(self, image_size, in_channels, model_channels, out_channels, num_res_blocks, attention_ds,
                 channel_mult, num_head_channels, use_scale_shift_norm, resblock_updown, dropout=0.0,
                 num_heads=1, use_new_attention_order=False, pool="attention"):
        super().__init__()
        assert pool == "attention", "only the attention pool is transcribed"
        self.model_channels = model_channels
        time_embed_dim = model_channels * 4
        self.time_embed = nn.Sequential(
            nn.Linear(model_channels, time_embed_dim),
            nn.SiLU(),
            nn.Linear(time_embed_dim, time_embed_dim),
        )

        def res(cin, cout, down=False):
            return ResBlock(cin, time_embed_dim, dropout, out_channels=cout,
                            use_scale_shift_norm=use_scale_shift_norm, down=down)

        def attn(c):
            return AttentionBlock(c, num_heads=num_heads, num_head_channels=num_head_channels,
                                  use_new_attention_order=use_new_attention_order)

        ch = int(channel_mult[0] * model_channels)
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(nn.Conv2d(in_channels, ch, 3, padding=1))])
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers = [res(ch, int(mult * model_channels))]
                ch = int(mult * model_channels)
                if ds in attention_ds:
                    layers.append(attn(ch))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(
                    res(ch, ch, down=True) if resblock_updown else Downsample(ch, True, out_channels=ch)))
                ds *= 2
        self.middle_block = TimestepEmbedSequential(res(ch, ch), attn(ch), res(ch, ch))
        assert num_head_channels != -1
        self.out = nn.Sequential(
            normalization(ch),
            nn.SiLU(),
            AttentionPool2d((image_size // ds), ch, num_head_channels, out_channels),
        )

    def forward(self, x, timesteps):
        dtype = self.time_embed[0].weight.dtype
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels, dtype=dtype))
        h = x
        for module in self.input_blocks:
            h = module(h, emb)
        h = self.middle_block(h, emb)
        return self.out(h)


def create_classifier(flags=None, preset=None, **kw):
    """The classifier of these flags (unet's names: classifier_width, ...; defaults =
    guided-diffusion's classifier_defaults(), or the named preset), float32, freshly initialised."""
    f = normalize_classifier_flags(flags, preset=preset, **kw)
    attention_ds = tuple(f["image_size"] // r for r in f["classifier_attention_resolutions"])
    return EncoderUNetModel(
        image_size=f["image_size"],
        in_channels=f["in_channels"],
        model_channels=f["classifier_width"],
        out_channels=f["num_classes"],
        num_res_blocks=f["classifier_depth"],
        attention_ds=attention_ds,
        channel_mult=f["classifier_channel_mult"],
        num_head_channels=f["classifier_num_head_channels"],
        use_scale_shift_norm=f["classifier_use_scale_shift_norm"],
        resblock_updown=f["classifier_resblock_updown"],
        pool=f["classifier_pool"],
    )


def classifier_state_dict_shapes(flags=None, preset=None, **kw):
    """[(name, shape)] of create_classifier(...).state_dict() without allocating weights."""
    from torch.overrides import TorchFunctionMode

    class _Meta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (torch.empty, torch.zeros, torch.ones, torch.tensor, torch.randn):
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    with _Meta():
        model = create_classifier(flags, preset=preset, **kw)
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


# ---- guidance ---------------------------------------------------------------------------------

def cond_fn(classifier, x, t_model, y, scale):
    """classifier_sample.py's cond_fn: scale * d/dx sum_b log_softmax(classifier(x, t))[b, y_b]."""
    with torch.enable_grad():
        x_in = x.detach().requires_grad_(True)
        logits = classifier(x_in, t_model)
        log_probs = torch.log_softmax(logits, dim=-1)
        selected = log_probs[range(len(logits)), y.view(-1)]
        return torch.autograd.grad(selected.sum(), x_in)[0] * scale


def _t_model(d, t):
    """The timestep the model (and so the classifier) sees for step indices t (_WrappedModel)."""
    t_orig = torch.tensor(d.timestep_map, dtype=torch.long)[t]
    t_model = t_orig.float()
    if d.rescale_timesteps:
        t_model = t_model * (1000.0 / d.original_num_steps)
    return t_model


def _variance(d, t, out, x):
    """p_mean_variance's "variance": exp(model_log_variance) for learned sigma, else the fixed-large
    variance (the float64 array at t, as guided-diffusion extracts it)."""
    import diffusion_torch as dt
    if d.learn_sigma:
        return torch.exp(out["log_variance"])
    return dt._extract(d.fixed_large_variance, t, x.shape)


def condition_mean(d, classifier, scale, out, x, t, y):
    """GaussianDiffusion.condition_mean: mean + variance * cond_fn(x, t)."""
    g = cond_fn(classifier, x, _t_model(d, t).to(x.dtype), y, scale)
    return out["mean"] + _variance(d, t, out, x) * g


def condition_score(d, classifier, scale, out, x, t, y):
    """GaussianDiffusion.condition_score: eps from the (clipped) x0, minus sqrt(1 - abar) cond_fn;
    x0 and the posterior mean re-derived from it (x0 not clipped again)."""
    import diffusion_torch as dt
    alpha_bar = dt._extract(d.alphas_cumprod, t, x.shape)
    eps = d.predict_eps_from_xstart(x, t, out["pred_xstart"])
    eps = eps - (1 - alpha_bar).sqrt() * cond_fn(classifier, x, _t_model(d, t).to(x.dtype), y, scale)
    out = dict(out)
    out["pred_xstart"] = d.predict_xstart_from_eps(x, t, eps)
    out["mean"] = d.q_posterior_mean(out["pred_xstart"], x, t)
    return out


def guided_p_sample(d, model, classifier, scale, x, t, z, y, clip=True, labels=None):
    """GaussianDiffusion.p_sample with cond_fn: the conditioned mean, then the noise (none at t == 0)."""
    out = d.p_mean_variance(model, x, t, clip, labels)
    nonzero = (t != 0).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    mean = condition_mean(d, classifier, scale, out, x, t, y)
    return mean + nonzero * torch.exp(0.5 * out["log_variance"]) * z


def guided_ddim_step(d, model, classifier, scale, x, t, z, y, eta=0.0, clip=True, labels=None):
    """GaussianDiffusion.ddim_sample with cond_fn (condition_score, then the DDIM update)."""
    import diffusion_torch as dt
    out = d.p_mean_variance(model, x, t, clip, labels)
    out = condition_score(d, classifier, scale, out, x, t, y)
    eps = d.predict_eps_from_xstart(x, t, out["pred_xstart"])
    alpha_bar = dt._extract(d.alphas_cumprod, t, x.shape)
    alpha_bar_prev = dt._extract(d.alphas_cumprod_prev, t, x.shape)
    sigma = eta * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar)) * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
    mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_prev) + torch.sqrt(1 - alpha_bar_prev - sigma ** 2) * eps
    nonzero = (t != 0).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    if z is None:
        z = torch.zeros_like(x)
    return mean_pred + nonzero * sigma * z


def guided_sample(model, classifier, scale, noise, y, sampler="ddim", steps=0, eta=0.0, clip=True, labels=None,
                  T=1000, schedule="linear", learn_sigma=False, rescale_timesteps=False, step_noise=None):
    """A whole guided run from x_T = noise with classes y (also the model's labels when given)."""
    import diffusion_torch as dt
    d = dt.Diffusion(T, schedule, learn_sigma, dt.sampler_timesteps(sampler, T, steps),
                     rescale_timesteps=rescale_timesteps)
    x = noise
    for k in reversed(range(d.num_timesteps)):
        t = torch.full((x.shape[0],), k, dtype=torch.long)
        if sampler == "ddim":
            z = None if eta == 0 else dt._noise(step_noise, k, d.timestep_map[k], x)
            with torch.no_grad():
                x = guided_ddim_step(d, model, classifier, scale, x, t, z, y, eta, clip, labels)
        else:
            z = dt._noise(step_noise, k, d.timestep_map[k], x)
            with torch.no_grad():
                x = guided_p_sample(d, model, classifier, scale, x, t, z, y, clip, labels)
    return x


# ---- golden values ----------------------------------------------------------------------------

def randomize(model, gen):
    """Every parameter random (the zero-initialised modules too), activations O(1); values
    rounded to bfloat16-representable float32 numbers as scripts/make_golden.py does."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = model.get_submodule(name.rsplit(".", 1)[0])
            if isinstance(module, nn.GroupNorm):
                v = (1 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64)) if name.endswith("weight") \
                    else 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif name.endswith("positional_embedding"):
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(p.shape[0])
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                fan_in = int(np.prod(p.shape[1:]))
                k = 0.5 if any(z in name for z in (".out_layers.3.", ".proj_out.")) else 1.0
                v = k * torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in)
            p.copy_(v.to(torch.bfloat16).to(p.dtype))


def write_classifier_attrs(f, flags):
    fl = normalize_classifier_flags(flags)
    f.attrs["format"] = FORMAT
    f.attrs["version"] = np.int64(VERSION)
    for k, v in fl.items():
        if isinstance(v, bool):
            f.attrs[k] = np.int64(int(v))
        elif isinstance(v, int):
            f.attrs[k] = np.int64(v)
        elif isinstance(v, tuple):
            whole = all(float(x).is_integer() for x in v)
            f.attrs[k] = np.asarray(v, dtype=np.int64 if whole else np.float64)
        else:
            f.attrs[k] = str(v)
    return fl


def _golden(argv):
    import argparse

    import h5py
    p = argparse.ArgumentParser(prog="classifier_torch.py golden")
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--preset", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    for k, v in CLASSIFIER_DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), dest=k, default=None)
    a = p.parse_args(argv)
    flags = normalize_classifier_flags({k: getattr(a, k) for k in CLASSIFIER_DEFAULTS if getattr(a, k) is not None},
                                       preset=a.preset)
    gen = torch.Generator().manual_seed(a.seed)
    model = create_classifier(flags)
    randomize(model, gen)
    model = model.double()
    B, C, S, K = a.batch, flags["in_channels"], flags["image_size"], flags["num_classes"]
    bf = lambda t: t.to(torch.bfloat16).to(torch.float64)  # noqa: E731
    x = bf(torch.randn(B, C, S, S, generator=gen, dtype=torch.float64)).requires_grad_(True)
    t = torch.randint(0, flags["diffusion_steps"], (B,), generator=gen).to(torch.float64)
    dout = bf(torch.randn(B, K, generator=gen, dtype=torch.float64))
    logits = model(x, t)
    (logits * dout).sum().backward()
    y = torch.randint(0, K, (B,), generator=gen)
    guide = cond_fn(model, x.detach(), t, y, a.scale)
    with h5py.File(a.out, "w") as f:
        write_classifier_attrs(f, flags)
        f.attrs["golden_seed"] = np.int64(a.seed)
        g = f.create_group("model")
        gg = f.create_group("grad")
        for name, prm in model.named_parameters():
            g.create_dataset(name, data=prm.detach().to(torch.float32).numpy())
            gg.create_dataset(name, data=prm.grad.numpy())  # float64
        f["x"] = x.detach().numpy().astype(np.float32)
        f["t"] = t.numpy().astype(np.float32)
        f["dout"] = dout.numpy().astype(np.float32)
        f["logits"] = logits.detach().numpy()
        f["dx"] = x.grad.numpy()
        f["guide_y"] = y.numpy().astype(np.int64)
        f.attrs["guide_scale"] = np.float64(a.scale)
        f["guide"] = guide.numpy()


if __name__ == "__main__":
    {"golden": _golden}[sys.argv[1]](sys.argv[2:])
