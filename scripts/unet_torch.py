"""PyTorch reference of guided-diffusion's UNetModel (Dhariwal & Nichol), written from SPEC §3.

The module tree mirrors guided-diffusion's exactly (TimestepEmbedSequential, ResBlock with
in_layers/emb_layers/out_layers/skip_connection, AttentionBlock with norm/qkv/proj_out,
Downsample.op, Upsample.conv, time_embed, label_emb, input_blocks, middle_block, output_blocks,
out), so `state_dict()` keys, order and shapes are those of guided-diffusion and of the `unet`
checkpoints' `model/` group. conv_resample is always True.

    from unet_torch import create_model
    model = create_model(image_size=32, num_channels=32, channel_mult="1,2", num_res_blocks=1,
                         attention_resolutions="16", num_head_channels=16)
    eps = model(x, t, y)          # x [B,C,H,W], t [B] integer timesteps as float, y [B] int64

Flag names are the `unet` / guided-diffusion script names; defaults are the `seed64` preset.
`attention_resolutions` are image resolutions (16 = 16x16 feature maps), as in the scripts.

The model also runs in float64 (`model.double()`): GroupNorm computes in at least float32 (like
guided-diffusion's GroupNorm32 for fp16), and the timestep-embedding arguments t*freq are always
formed in float32 exactly as guided-diffusion does, so a float64 model is the exact-arithmetic
version of the fp32 PyTorch model (used for golden files).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Model flags with the seed64 defaults (SPEC §1 init). diffusion_steps / noise_schedule are
# diffusion flags: accepted and carried in checkpoints, unused by the network.
DEFAULT_FLAGS = dict(
    image_size=64,
    in_channels=3,
    num_channels=64,
    channel_mult=(1, 2, 3, 4),
    num_res_blocks=2,
    attention_resolutions=(16, 8),
    num_heads=1,
    num_head_channels=32,
    use_new_attention_order=True,
    use_scale_shift_norm=False,
    resblock_updown=False,
    learn_sigma=False,
    class_cond=False,
    num_classes=1000,
    dropout=0.0,
    diffusion_steps=1000,
    noise_schedule="linear",
    # the training objective (guided-diffusion's diffusion flags; absent in older checkpoints)
    use_kl=False,
    predict_xstart=False,
    rescale_learned_sigmas=False,
    rescale_timesteps=False,
    # classifier-free guidance: label_emb has num_classes + 1 rows, the last the null class (absent
    # in checkpoints without one, and in guided-diffusion's models)
    null_class=False,
    class_dropout=0.0,
)
OBJECTIVE_FLAGS = ("use_kl", "predict_xstart", "rescale_learned_sigmas", "rescale_timesteps")
CFG_FLAGS = ("null_class", "class_dropout")



def _released(image_size, **kw):
    """A released guided-diffusion model: its README's MODEL_FLAGS on top of guided-diffusion's
    model_and_diffusion_defaults() (which differ from ours: 4 heads of any width, legacy attention
    order, scale-shift norm), with create_model's channel_mult for the image size."""
    mult = {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}
    f = dict(image_size=image_size, num_channels=256, channel_mult=mult[image_size], num_res_blocks=2,
             attention_resolutions=(32, 16, 8), num_heads=4, num_head_channels=-1, use_new_attention_order=False,
             use_scale_shift_norm=True, resblock_updown=True, learn_sigma=True, class_cond=False,
             num_classes=1000, dropout=0.0, diffusion_steps=1000, noise_schedule="linear")
    f.update(kw)
    return f


# Same presets as lib/model/config.cpp (tests/test_released_models.py checks they agree).
PRESETS = {
    "seed64": dict(),
    "tiny32": dict(image_size=32, num_channels=32, channel_mult=(1, 2), num_res_blocks=1,
                   attention_resolutions=(16,), num_head_channels=16),
    "imagenet64": _released(64, num_channels=192, num_res_blocks=3, num_head_channels=64,
                            use_new_attention_order=True, class_cond=True, dropout=0.1, noise_schedule="cosine"),
    "imagenet128": _released(128, class_cond=True),
    "imagenet256": _released(256, num_head_channels=64, class_cond=True),
    "imagenet256-uncond": _released(256, num_head_channels=64),
    "imagenet512": _released(512, num_head_channels=64, class_cond=True),
    "lsun256": _released(256, num_head_channels=64, dropout=0.1),  # bedroom, cat and horse
}

_BOOL_FLAGS = ("use_new_attention_order", "use_scale_shift_norm", "resblock_updown", "learn_sigma",
               "class_cond", "null_class") + OBJECTIVE_FLAGS
_INT_FLAGS = ("image_size", "in_channels", "num_channels", "num_res_blocks", "num_heads",
              "num_head_channels", "num_classes", "diffusion_steps")


def _int_list(v):
    if v is None:
        return ()
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        v = v.strip()
        if v in ("", "none"):
            return ()
        return tuple(int(s) for s in v.split(","))
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, int):
        return (v,)
    return tuple(int(s) for s in v)


def _mult_list(v):
    """Channel multipliers: whole numbers as int, fractions (imagenet512's 0.5) as float."""
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        v = [float(s) for s in v.split(",")] if v.strip() else []
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (int, float)):
        v = [v]
    return tuple(int(x) if float(x).is_integer() else float(x) for x in v)


def normalize_flags(flags=None, preset=None, **kw):
    """Returns a complete flag dict (defaults, then preset, then `flags`, then keyword args) with
    plain Python types: ints, bools, float, str, int tuples (channel_mult may hold floats).
    Unknown keys are dropped."""
    out = dict(DEFAULT_FLAGS)
    if preset is not None:
        out.update(PRESETS[preset])
    for src in (flags or {}), kw:
        for k, v in src.items():
            if k in DEFAULT_FLAGS:
                out[k] = v
    for k in _BOOL_FLAGS:
        v = out[k]
        if isinstance(v, (str, bytes)):
            v = v.decode() if isinstance(v, bytes) else v
            v = v.lower() in ("1", "true", "yes")
        out[k] = bool(v)
    for k in _INT_FLAGS:
        out[k] = int(out[k])
    out["dropout"] = float(out["dropout"])
    out["class_dropout"] = float(out["class_dropout"])
    ns = out["noise_schedule"]
    out["noise_schedule"] = ns.decode() if isinstance(ns, bytes) else str(ns)
    out["channel_mult"] = _mult_list(out["channel_mult"])
    out["attention_resolutions"] = _int_list(out["attention_resolutions"])
    return out


class GroupNorm32(nn.GroupNorm):
    # Half-precision inputs are normalised in float32 (guided-diffusion's GroupNorm32); float32 and
    # float64 inputs keep their precision.
    def forward(self, x):
        if x.dtype in (torch.float16, torch.bfloat16):
            return F.group_norm(x.float(), self.num_groups, self.weight.float(), self.bias.float(),
                                self.eps).type(x.dtype)
        return super().forward(x)


def normalization(channels):
    return GroupNorm32(32, channels)


def zero_module(module):
    for p in module.parameters():
        p.detach().zero_()
    return module


def timestep_embedding(timesteps, dim, dtype=torch.float32, max_period=10000):
    """[N] -> [N, dim]: [cos(t*f), sin(t*f)], f_i = exp(-ln(max_period) * i / half).
    freqs and t*f are float32 as in guided-diffusion; cos/sin are taken in `dtype`."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
    args = timesteps[:, None].float() * freqs.to(timesteps.device)[None]
    args = args.to(dtype)
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepBlock(nn.Module):
    """A module whose forward takes the embedding as a second argument."""

    def forward(self, x, emb):
        raise NotImplementedError


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    def forward(self, x, emb):
        for layer in self:
            x = layer(x, emb) if isinstance(layer, TimestepBlock) else layer(x)
        return x


class Upsample(nn.Module):
    """Nearest 2x, then (use_conv) a 3x3 conv."""

    def __init__(self, channels, use_conv, out_channels=None):
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        if use_conv:
            self.conv = nn.Conv2d(channels, self.out_channels, 3, padding=1)

    def forward(self, x):
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        return self.conv(x) if self.use_conv else x


class Downsample(nn.Module):
    """3x3 conv with stride 2 (use_conv) or 2x2 average pooling."""

    def __init__(self, channels, use_conv, out_channels=None):
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        if use_conv:
            self.op = nn.Conv2d(channels, self.out_channels, 3, stride=2, padding=1)
        else:
            assert self.channels == self.out_channels
            self.op = nn.AvgPool2d(kernel_size=2, stride=2)

    def forward(self, x):
        return self.op(x)


class ResBlock(TimestepBlock):
    def __init__(self, channels, emb_channels, dropout, out_channels=None, use_scale_shift_norm=False,
                 up=False, down=False):
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        self.use_scale_shift_norm = use_scale_shift_norm
        self.in_layers = nn.Sequential(
            normalization(channels),
            nn.SiLU(),
            nn.Conv2d(channels, self.out_channels, 3, padding=1),
        )
        self.updown = up or down
        if up:
            self.h_upd = Upsample(channels, False)
            self.x_upd = Upsample(channels, False)
        elif down:
            self.h_upd = Downsample(channels, False)
            self.x_upd = Downsample(channels, False)
        else:
            self.h_upd = self.x_upd = nn.Identity()
        self.emb_layers = nn.Sequential(
            nn.SiLU(),
            nn.Linear(emb_channels, 2 * self.out_channels if use_scale_shift_norm else self.out_channels),
        )
        self.out_layers = nn.Sequential(
            normalization(self.out_channels),
            nn.SiLU(),
            nn.Dropout(p=dropout),
            zero_module(nn.Conv2d(self.out_channels, self.out_channels, 3, padding=1)),
        )
        if self.out_channels == channels:
            self.skip_connection = nn.Identity()
        else:
            self.skip_connection = nn.Conv2d(channels, self.out_channels, 1)

    def forward(self, x, emb):
        if self.updown:
            in_rest, in_conv = self.in_layers[:-1], self.in_layers[-1]
            h = in_rest(x)
            h = self.h_upd(h)
            x = self.x_upd(x)
            h = in_conv(h)
        else:
            h = self.in_layers(x)
        emb_out = self.emb_layers(emb).type(h.dtype)[:, :, None, None]
        if self.use_scale_shift_norm:
            out_norm, out_rest = self.out_layers[0], self.out_layers[1:]
            scale, shift = torch.chunk(emb_out, 2, dim=1)
            h = out_norm(h) * (1 + scale) + shift
            h = out_rest(h)
        else:
            h = self.out_layers(h + emb_out)
        return self.skip_connection(x) + h


class QKVAttentionLegacy(nn.Module):
    """Heads first: each head owns 3*d consecutive channels of qkv, q|k|v inside it."""

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv):
        bs, width, length = qkv.shape
        assert width % (3 * self.n_heads) == 0
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
        weight = torch.softmax(weight, dim=-1)
        a = torch.einsum("bts,bcs->bct", weight, v)
        return a.reshape(bs, -1, length)


class QKVAttention(nn.Module):
    """q, k, v first: the three C-wide thirds of qkv, each then split into heads."""

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv):
        bs, width, length = qkv.shape
        assert width % (3 * self.n_heads) == 0
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.chunk(3, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum(
            "bct,bcs->bts",
            (q * scale).reshape(bs * self.n_heads, ch, length),
            (k * scale).reshape(bs * self.n_heads, ch, length),
        )
        weight = torch.softmax(weight, dim=-1)
        a = torch.einsum("bts,bcs->bct", weight, v.reshape(bs * self.n_heads, ch, length))
        return a.reshape(bs, -1, length)


class AttentionBlock(nn.Module):
    def __init__(self, channels, num_heads=1, num_head_channels=-1, use_new_attention_order=False):
        super().__init__()
        self.channels = channels
        if num_head_channels == -1:
            self.num_heads = num_heads
        else:
            assert channels % num_head_channels == 0, (channels, num_head_channels)
            self.num_heads = channels // num_head_channels
        self.norm = normalization(channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.attention = QKVAttention(self.num_heads) if use_new_attention_order else QKVAttentionLegacy(
            self.num_heads)
        self.proj_out = zero_module(nn.Conv1d(channels, channels, 1))

    def forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        h = self.attention(self.qkv(self.norm(x)))
        h = self.proj_out(h)
        return (x + h).reshape(b, c, *spatial)


class UNetModel(nn.Module):
    """guided-diffusion's UNetModel (dims=2, conv_resample=True). `attention_ds` are downsample
    rates (image_size // resolution), as guided-diffusion's constructor takes them."""

    def __init__(self, image_size, in_channels, model_channels, out_channels, num_res_blocks, attention_ds,
                 dropout=0.0, channel_mult=(1, 2, 4, 8), num_classes=None, num_heads=1, num_head_channels=-1,
                 use_scale_shift_norm=False, resblock_updown=False, use_new_attention_order=False):
        super().__init__()
        self.image_size = image_size
        self.in_channels = in_channels
        self.model_channels = model_channels
        self.out_channels = out_channels
        self.num_classes = num_classes
        time_embed_dim = model_channels * 4
        self.time_embed = nn.Sequential(
            nn.Linear(model_channels, time_embed_dim),
            nn.SiLU(),
            nn.Linear(time_embed_dim, time_embed_dim),
        )
        if num_classes is not None:
            self.label_emb = nn.Embedding(num_classes, time_embed_dim)

        def res(cin, cout, up=False, down=False):
            return ResBlock(cin, time_embed_dim, dropout, out_channels=cout,
                            use_scale_shift_norm=use_scale_shift_norm, up=up, down=down)

        def attn(c):
            return AttentionBlock(c, num_heads=num_heads, num_head_channels=num_head_channels,
                                  use_new_attention_order=use_new_attention_order)

        ch = input_ch = int(channel_mult[0] * model_channels)
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(nn.Conv2d(in_channels, ch, 3, padding=1))])
        input_block_chans = [ch]
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers = [res(ch, int(mult * model_channels))]
                ch = int(mult * model_channels)
                if ds in attention_ds:
                    layers.append(attn(ch))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                input_block_chans.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(
                    res(ch, ch, down=True) if resblock_updown else Downsample(ch, True, out_channels=ch)))
                input_block_chans.append(ch)
                ds *= 2

        self.middle_block = TimestepEmbedSequential(res(ch, ch), attn(ch), res(ch, ch))

        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                ich = input_block_chans.pop()
                layers = [res(ch + ich, int(model_channels * mult))]
                ch = int(model_channels * mult)
                if ds in attention_ds:
                    layers.append(attn(ch))  # num_heads_upsample == num_heads
                if level and i == num_res_blocks:
                    layers.append(res(ch, ch, up=True) if resblock_updown else Upsample(ch, True, out_channels=ch))
                    ds //= 2
                self.output_blocks.append(TimestepEmbedSequential(*layers))

        self.out = nn.Sequential(
            normalization(ch),
            nn.SiLU(),
            zero_module(nn.Conv2d(input_ch, out_channels, 3, padding=1)),
        )

    def forward(self, x, timesteps, y=None):
        assert (y is not None) == (self.num_classes is not None), \
            "pass y if and only if the model is class-conditional"
        dtype = self.time_embed[0].weight.dtype
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels, dtype=dtype))
        if self.num_classes is not None:
            assert y.shape == (x.shape[0],)
            emb = emb + self.label_emb(y)
        hs = []
        h = x
        for module in self.input_blocks:
            h = module(h, emb)
            hs.append(h)
        h = self.middle_block(h, emb)
        for module in self.output_blocks:
            h = torch.cat([h, hs.pop()], dim=1)
            h = module(h, emb)
        return self.out(h)


def create_model(flags=None, preset=None, **kw):
    """Builds the UNet from `unet` flag names (dict and/or keywords; defaults = seed64, or the
    named preset). Returns the model in float32, freshly initialised as PyTorch/guided-diffusion
    does (zero modules zero)."""
    f = normalize_flags(flags, preset=preset, **kw)
    attention_ds = tuple(f["image_size"] // r for r in f["attention_resolutions"])
    return UNetModel(
        image_size=f["image_size"],
        in_channels=f["in_channels"],
        model_channels=f["num_channels"],
        out_channels=2 * f["in_channels"] if f["learn_sigma"] else f["in_channels"],
        num_res_blocks=f["num_res_blocks"],
        attention_ds=attention_ds,
        dropout=f["dropout"],
        channel_mult=f["channel_mult"],
        num_classes=f["num_classes"] + int(f["null_class"]) if f["class_cond"] else None,
        num_heads=f["num_heads"],
        num_head_channels=f["num_head_channels"],
        use_scale_shift_norm=f["use_scale_shift_norm"],
        resblock_updown=f["resblock_updown"],
        use_new_attention_order=f["use_new_attention_order"],
    )


def state_dict_shapes(flags=None, preset=None, **kw):
    """[(name, shape)] of create_model(...).state_dict(), in order, without allocating or
    initialising weights (the model is built on the 'meta' device): cheap even for 550 M params."""
    from torch.overrides import TorchFunctionMode

    class _Meta(TorchFunctionMode):  # torch 1.13 has no `with torch.device("meta")`
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (torch.empty, torch.zeros, torch.ones, torch.tensor):
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    with _Meta():
        model = create_model(flags, preset=preset, **kw)
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
