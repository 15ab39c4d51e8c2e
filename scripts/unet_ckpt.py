"""Exchange `unet` HDF5 checkpoints with PyTorch (SPEC §2).

    from unet_ckpt import load_checkpoint, save_checkpoint
    model, flags = load_checkpoint("ckpt.h5")              # strict load of model/ (or ema/)
    save_checkpoint(model, flags, "from_torch.h5")         # `unet sample from_torch.h5` loads it

Layout: model/<name> (and ema/<name>) float32 datasets named and shaped exactly as
UNetModel.state_dict(); root attributes format="unet-checkpoint", version=1 and every model /
diffusion flag under its guided-diffusion name (booleans stored as int64 0/1, lists as int64
arrays, dropout float64, noise_schedule string). Optional optimizer/ and state groups written by
`unet train` are ignored here.

Run as a script to describe a checkpoint:  python3 scripts/unet_ckpt.py CKPT.h5
"""

import sys

import h5py
import numpy as np
import torch

from unet_torch import DEFAULT_FLAGS, create_model, normalize_flags

FORMAT = "unet-checkpoint"
VERSION = 1


def _attr_str(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.shape == ():
        return _attr_str(v[()])
    return str(v)


def read_flags(f):
    """Model/diffusion flags from the root attributes of an open h5py File (plain Python types)."""
    fmt = _attr_str(f.attrs.get("format", ""))
    if fmt != FORMAT:
        raise ValueError(f"{f.filename}: not a unet checkpoint (format attribute is {fmt!r})")
    missing = [k for k in DEFAULT_FLAGS if k not in f.attrs]
    if missing:
        raise ValueError(f"{f.filename}: missing attribute(s) {', '.join(missing)}")
    return normalize_flags({k: f.attrs[k] for k in DEFAULT_FLAGS})


def read_state_dict(group):
    """{name: tensor} from an h5py group of datasets (PyTorch layout)."""
    return {k: torch.from_numpy(np.asarray(v[()], dtype=np.float32)) for k, v in group.items()}


def load_checkpoint(path, use_ema=False, map_location="cpu"):
    """Returns (model, flags): the UNet built from the root attributes with model/ (or ema/ when
    use_ema and present) loaded strictly. The model is float32, in eval mode."""
    with h5py.File(path, "r") as f:
        flags = read_flags(f)
        group = "ema" if use_ema and "ema" in f else "model"
        sd = read_state_dict(f[group])
    model = create_model(flags)
    model.load_state_dict(sd, strict=True)
    return model.to(map_location).eval(), flags


def _write_flags(f, flags):
    fl = normalize_flags(flags)
    f.attrs["format"] = FORMAT
    f.attrs["version"] = np.int64(VERSION)
    for k, v in fl.items():
        if isinstance(v, bool):
            f.attrs[k] = np.int64(int(v))
        elif isinstance(v, int):
            f.attrs[k] = np.int64(v)
        elif isinstance(v, float):
            f.attrs[k] = np.float64(v)
        elif isinstance(v, tuple):
            # int64 like `unet init`; float64 only for fractional multipliers (imagenet512's 0.5)
            whole = all(float(x).is_integer() for x in v)
            f.attrs[k] = np.asarray(v, dtype=np.int64 if whole else np.float64)
        else:
            f.attrs[k] = str(v)
    return fl


def _write_group(f, name, sd):
    g = f.create_group(name)
    for k, v in sd.items():
        g.create_dataset(k, data=v.detach().to("cpu", torch.float32).contiguous().numpy())


def save_checkpoint(model, flags, path, ema=None):
    """Writes `model` (and optionally an EMA model or state dict) in the SPEC §2 layout. `flags`
    are the model flags (missing ones take the seed64 defaults). The file is written under a
    temporary name and renamed into place."""
    import os

    sd = model.state_dict() if hasattr(model, "state_dict") else model
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            _write_flags(f, flags)
            _write_group(f, "model", sd)
            if ema is not None:
                _write_group(f, "ema", ema.state_dict() if hasattr(ema, "state_dict") else ema)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---- `unet init`'s generator, transcribed (lib/init.cpp) -------------------------------------
_M64 = (1 << 64) - 1


def _splitmix64(x):
    """splitmix64 on a numpy uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _fnv1a(s):
    h = 0xcbf29ce484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001b3) & _M64
    return h


def _unit(key, idx):
    """Uniform [0,1) doubles from the top 53 bits of splitmix64(key ^ splitmix64(idx))."""
    bits = _splitmix64(np.uint64(key) ^ _splitmix64(idx.astype(np.uint64)))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def unet_init_state_dict(flags, seed=0):
    """The weights `unet init --seed SEED` writes for these flags, recomputed in numpy: element i
    (PyTorch order) of tensor `name` depends only on (seed, name, i). Uniform tensors are exact;
    normals may differ from the C++ ones in the last bit (libm log/cos/sin)."""
    model = create_model(flags)
    out = {}
    for name, t in model.state_dict().items():
        n = t.numel()
        key = int(_splitmix64(np.uint64(seed) ^ _splitmix64(np.uint64(_fnv1a(name)))))
        module = model.get_submodule(name.rsplit(".", 1)[0])
        zero = any(z in name for z in (".out_layers.3.", ".proj_out.")) or name.startswith("out.2.")
        if zero:
            v = np.zeros(n, np.float32)
        elif isinstance(module, torch.nn.GroupNorm):
            v = np.ones(n, np.float32) if name.endswith(".weight") else np.zeros(n, np.float32)
        elif isinstance(module, torch.nn.Embedding):
            k = np.arange((n + 1) // 2, dtype=np.uint64)
            u1 = 1.0 - _unit(key, 2 * k)
            u2 = _unit(key, 2 * k + 1)
            r = np.sqrt(-2.0 * np.log(u1))
            z = np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], axis=1).reshape(-1)[:n]
            v = z.astype(np.float32)
        else:
            w = module.weight
            fan_in = int(np.prod(w.shape[1:]))
            bound = 1.0 / np.sqrt(float(fan_in))
            v = (bound * (2.0 * _unit(key, np.arange(n, dtype=np.uint64)) - 1.0)).astype(np.float32)
        out[name] = torch.from_numpy(v.reshape(tuple(t.shape)))
    return out


def main(argv):
    if len(argv) != 2:
        print("usage: unet_ckpt.py CKPT.h5", file=sys.stderr)
        return 2
    with h5py.File(argv[1], "r") as f:
        flags = read_flags(f)
        n = sum(int(np.prod(d.shape)) for d in f["model"].values())
        print(" ".join(f"{k}={v}" for k, v in flags.items()))
        print(f"{len(f['model'])} tensors, {n / 1e6:.2f} M parameters; groups: {', '.join(f.keys())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
